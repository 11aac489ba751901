"""``python -m edgefuse.xnnpack.bench``: hands over to the benchmark, :mod:`edgefuse.cli.xnnpack_bench`.

The benchmark is a command-line tool and lives in the application; this module keeps the documented
command. It silences the warnings torch and torchao log as they are imported before the tool imports them.
"""

if __name__ == "__main__":
    from edgefuse.cli.progress import quiet_libraries

    quiet_libraries()

    from edgefuse.cli.xnnpack_bench import main

    raise SystemExit(main())
