"""Evaluate a checkpoint or an exported model: ``python scripts/evaluate.py checkpoint=outputs/.../seed0``.

The same as the ``rsnet-evaluate`` command (the code is rsnet/commands/evaluate.py; the settings conf/evaluate.yaml).
"""

from rsnet.commands.evaluate import run

if __name__ == "__main__":
    run()
