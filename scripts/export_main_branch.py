"""Export a trained model: ``python scripts/export_main_branch.py checkpoint=outputs/run/checkpoints/last.pt``.

The same as the ``rsnet-export`` command (the code, and every option, is in rsnet/commands/export.py).
"""

from rsnet.commands.export import run

if __name__ == "__main__":
    run()
