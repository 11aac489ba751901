"""``python -m edgefuse.quant``: hands over to the quantization tables, :mod:`edgefuse.cli.quant_command`.

The tables are a command-line tool and live in the application; this module keeps the documented command.
"""

if __name__ == "__main__":
    from edgefuse.cli.quant_command import main

    raise SystemExit(main())
