"""Protocol table (mean ± std over seeds): ``python scripts/aggregate.py multirun/``.

The same as the ``rsnet-aggregate`` command (the code is rsnet/commands/aggregate.py).
"""

from rsnet.commands.aggregate import main

if __name__ == "__main__":
    main()
