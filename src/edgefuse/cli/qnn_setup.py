"""``edgefuse qnn setup [DIR]`` and ``edgefuse qnn env [DIR]``: QNN's libraries from a package registry.

The work is :mod:`edgefuse.qnn.sdk`'s; this prints its progress (stderr) and the environment another
process needs (stdout: shell lines, so ``eval "$(edgefuse qnn env)"`` works), and turns its errors
into exit code 3.
"""

from __future__ import annotations

import os
from typing import Callable

from edgefuse.inputs.errors import OK

Say = Callable[[str], None]


def run(args, say: Say) -> int:
    from edgefuse.inputs.errors import qnn_sdk_error
    from edgefuse.qnn.sdk import QnnSdkUnavailable, QnnSdkUnsafe, default_root, find, setup

    try:
        if args.qnn_command == "setup":
            sdk, new = setup(args.dir, wheel=args.wheel, progress=say)
            say(f"QNN libraries set up in {sdk.root}" if new else f"{sdk.root} is set up already: reused")
            named = os.environ.get("QNN_SDK_ROOT")
            if named and os.path.abspath(named) != str(sdk.root):
                say(f"QNN_SDK_ROOT={named} is set: while it is, edgefuse uses that SDK, not this one")
        else:
            sdk = find(args.dir)
            if not sdk:
                raise (QnnSdkUnsafe if sdk.unsafe else QnnSdkUnavailable)(sdk.reason)
    except QnnSdkUnavailable as error:
        raise qnn_sdk_error(error) from error
    manifest = sdk.manifest
    if manifest:
        print(f"# QNN {manifest['qnn_version']} from {manifest['package']} {manifest['package_version']} in "
              f"{sdk.root}; self-check: {manifest['self_check']['detail']}")
    else:
        print(f"# the QNN SDK in {sdk.root} (from {sdk.source})")
    if sdk.root == default_root() or sdk.source == "QNN_SDK_ROOT":
        print("# edgefuse's own QNN commands find it by themselves; another process needs:")
    else:
        print("# edgefuse's QNN commands and any other process find it through these lines:")
    for line in sdk.shell_lines():
        print(line)
    return OK
