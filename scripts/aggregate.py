"""Protocol table (mean ± std over seeds): ``python scripts/aggregate.py folders=multirun/``.

The same as the ``rsnet-aggregate`` command (the code is rsnet/commands/aggregate.py).
"""

from rsnet.commands.aggregate import run

if __name__ == "__main__":
    run()
