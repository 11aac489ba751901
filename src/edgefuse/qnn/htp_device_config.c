/*
 * A stand-in for QNN's libQnnHtp.so that lets ExecuTorch 1.5.1 start the HTP backend of QNN 2.47 and
 * later.
 *
 * Why it exists: ExecuTorch 1.5.1 was built against the QNN 2.37 headers. It tells the HTP backend
 * which SoC to compile for in an HTP device custom config (QnnHtpDevice_CustomConfig_t: a 32-bit
 * option, then a union). In 2.37 every member of that union is 4-byte aligned, so the union sits at
 * byte offset 4; from 2.47 the union also holds a pointer (htpExtension), so it sits at offset 8.
 * The newer library reads the SoC model from the wrong bytes ("unknown custom config socModel 0")
 * and every HTP device creation fails, when ExecuTorch lowers a program and when it runs one.
 *
 * What it does: this library carries the SONAME libQnnHtp.so and opens the real library (at the path
 * given when it is compiled, relative to the folder this library is in). In the function table of
 * each of the real library's providers it replaces deviceCreate and deviceSetConfig by functions that
 * rewrite each HTP device custom config into the newer layout before passing it on, and it answers
 * QnnInterface_getProviders with those providers; everything else is the real library's own. It is
 * for callers built against the 2.37 headers (ExecuTorch 1.5.1) only: a caller built against the
 * newer ones would have its configs moved a second time.
 *
 * Link it with -Wl,-z,nodelete: ExecuTorch opens and closes the HTP library once to read its
 * version, and the process must not fall back to the real library (which has the same SONAME) when
 * it opens the library by name afterwards.
 *
 * Only the layout facts below are needed, so no QNN header is: the QNN interface provider struct
 * (QnnInterface_t) holds a 32-bit backend id, a name pointer and two 12-byte versions before its
 * function table, which therefore starts at byte 40; deviceCreate and deviceSetConfig are entries
 * 40 and 41 of that table; QnnDevice_Config_t is a 32-bit option and a pointer-aligned union whose
 * custom member points to the backend's own config.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef REAL_LIBRARY
#error "compile with -DREAL_LIBRARY='\"path/of/the/real/libQnnHtp.so relative to this library\"'"
#endif

typedef uint64_t qnn_error_t;      /* Qnn_ErrorHandle_t; 0 is QNN_SUCCESS */
#define QNN_COMMON_ERROR_GENERAL 1000  /* QNN_COMMON_ERROR_GENERAL */
#define QNN_COMMON_ERROR_MEM_ALLOC 1002  /* QNN_COMMON_ERROR_MEM_ALLOC */

#define TABLE_OFFSET 40            /* offsetof(QnnInterface_t, v2_x) */
#define DEVICE_CREATE 40           /* index of deviceCreate in the function table */
#define DEVICE_SET_CONFIG 41       /* index of deviceSetConfig */
#define DEVICE_CONFIG_OPTION_CUSTOM 0  /* QNN_DEVICE_CONFIG_OPTION_CUSTOM */

typedef struct {                   /* QnnDevice_Config_t */
  uint32_t option;
  void *custom;                    /* union: customConfig, hardwareInfo */
} device_config_t;

typedef struct {                   /* QnnHtpDevice_CustomConfig_t of the 2.37 headers: 12 bytes */
  uint32_t option;
  unsigned char value[8];          /* union at offset 4 */
} old_htp_config_t;

typedef struct {                   /* QnnHtpDevice_CustomConfig_t of the 2.47+ headers: 16 bytes */
  uint32_t option;
  uint32_t padding;
  unsigned char value[8];          /* union at offset 8 */
} new_htp_config_t;

typedef qnn_error_t (*get_providers_fn)(const void ***providers, uint32_t *count);
typedef qnn_error_t (*device_create_fn)(void *logger, const device_config_t **config, void **device);
typedef qnn_error_t (*device_set_config_fn)(void *device, const device_config_t **config);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static get_providers_fn real_get_providers;
static device_create_fn real_device_create;
static device_set_config_fn real_device_set_config;
static qnn_error_t load_error;

static void say(const char *what, const char *detail) {
  fprintf(stderr, "[edgefuse htp_device_config] %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
}

/* The real library's path: REAL_LIBRARY resolved against the folder holding this library. */
static int real_path(char *out, size_t size) {
  Dl_info info;
  if (!dladdr((void *)&real_path, &info) || !info.dli_fname) return -1;
  const char *slash = strrchr(info.dli_fname, '/');
  size_t folder = slash ? (size_t)(slash - info.dli_fname) : 0;
  int n = slash ? snprintf(out, size, "%.*s/%s", (int)folder, info.dli_fname, REAL_LIBRARY)
                : snprintf(out, size, "./%s", REAL_LIBRARY);
  return n > 0 && (size_t)n < size ? 0 : -1;
}

struct relro_search {
  uintptr_t address;
  uintptr_t start, end;            /* the read-only-after-relocation range holding address, or 0, 0 */
};

static int find_relro(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct relro_search *search = data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_GNU_RELRO && search->address >= start && search->address < start + ph->p_memsz) {
      search->start = start;
      search->end = start + ph->p_memsz;
      return 1;
    }
  }
  return 0;
}

/* Replace two entries of a provider's function table where it lies. QNN 2.51 builds its provider on
   the heap; a provider in a library's read-only-after-relocation data is made writable for the write
   and read-only again after it. Patching in place needs no knowledge of the table's length. */
static int patch(void **entries, void *create, void *set_config) {
  struct relro_search search = {(uintptr_t)entries, 0, 0};
  dl_iterate_phdr(find_relro, &search);
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t first = (uintptr_t)entries & ~(page - 1);
  size_t length = (((uintptr_t)(entries + 2) + page - 1) & ~(page - 1)) - first;
  if (search.end && mprotect((void *)first, length, PROT_READ | PROT_WRITE) != 0) return -1;
  entries[0] = create;
  entries[1] = set_config;
  if (search.end) mprotect((void *)first, length, PROT_READ);
  return 0;
}

/* A copy of a null-terminated config list with each custom config moved to the newer layout; freed by
   the caller with free() (one block). NULL if memory runs out. */
static const device_config_t **converted(const device_config_t **config) {
  size_t n = 0;
  while (config && config[n]) n++;
  size_t bytes = (n + 1) * sizeof(device_config_t *) + n * (sizeof(device_config_t) + sizeof(new_htp_config_t));
  unsigned char *block = calloc(1, bytes);
  if (!block) return NULL;
  const device_config_t **list = (const device_config_t **)block;
  device_config_t *entries = (device_config_t *)(block + (n + 1) * sizeof(device_config_t *));
  new_htp_config_t *customs = (new_htp_config_t *)(entries + n);
  for (size_t i = 0; i < n; i++) {
    entries[i] = *config[i];
    if (config[i]->option == DEVICE_CONFIG_OPTION_CUSTOM && config[i]->custom) {
      const old_htp_config_t *old = config[i]->custom;
      customs[i].option = old->option;
      memcpy(customs[i].value, old->value, sizeof old->value);
      entries[i].custom = &customs[i];
    }
    list[i] = &entries[i];
  }
  list[n] = NULL;
  return list;
}

static qnn_error_t device_create(void *logger, const device_config_t **config, void **device) {
  if (!config) return real_device_create(logger, config, device);
  const device_config_t **list = converted(config);
  if (!list) return QNN_COMMON_ERROR_MEM_ALLOC;
  qnn_error_t error = real_device_create(logger, list, device);
  free((void *)list);
  return error;
}

static qnn_error_t device_set_config(void *device, const device_config_t **config) {
  if (!config) return real_device_set_config(device, config);
  const device_config_t **list = converted(config);
  if (!list) return QNN_COMMON_ERROR_MEM_ALLOC;
  qnn_error_t error = real_device_set_config(device, list);
  free((void *)list);
  return error;
}

static void load(void) {
  char path[PATH_MAX];
  load_error = QNN_COMMON_ERROR_GENERAL;
  if (real_path(path, sizeof path) != 0) {
    say("cannot tell where the real libQnnHtp.so is", NULL);
    return;
  }
  void *real = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!real) {
    say("cannot open the real libQnnHtp.so", dlerror());
    return;
  }
  real_get_providers = (get_providers_fn)dlsym(real, "QnnInterface_getProviders");
  if (!real_get_providers) {
    say("the real libQnnHtp.so has no QnnInterface_getProviders", path);
    return;
  }
  const void **providers = NULL;
  uint32_t count = 0;
  load_error = real_get_providers(&providers, &count);
  if (load_error) return;
  for (uint32_t i = 0; i < count; i++) {
    void **table = (void **)((unsigned char *)providers[i] + TABLE_OFFSET);
    if (table[DEVICE_CREATE] == (void *)device_create) continue;  /* patched already */
    if (real_device_create && (table[DEVICE_CREATE] != (void *)real_device_create ||
                               table[DEVICE_SET_CONFIG] != (void *)real_device_set_config)) {
      say("the real libQnnHtp.so has providers with different device functions", path);
      load_error = QNN_COMMON_ERROR_GENERAL;
      return;
    }
    real_device_create = (device_create_fn)table[DEVICE_CREATE];
    real_device_set_config = (device_set_config_fn)table[DEVICE_SET_CONFIG];
    if (patch(&table[DEVICE_CREATE], (void *)device_create, (void *)device_set_config) != 0) {
      say("cannot write the device functions of the real libQnnHtp.so's provider", path);
      load_error = QNN_COMMON_ERROR_GENERAL;
      return;
    }
  }
}

__attribute__((visibility("default"))) qnn_error_t QnnInterface_getProviders(const void ***providers,
                                                                             uint32_t *count) {
  pthread_once(&once, load);
  if (load_error) return load_error;
  return real_get_providers(providers, count);
}
