"""``python -m edgefuse.xnnpack.check_models``: hands over to :mod:`edgefuse.cli.check_models`.

The check is a command-line tool and lives in the application; this module keeps the documented
command. It silences the warnings torch and torchao log as they are imported before the tool imports them.
"""

if __name__ == "__main__":
    from edgefuse.cli.progress import quiet_libraries

    quiet_libraries()

    from edgefuse.cli.check_models import main

    raise SystemExit(main())
