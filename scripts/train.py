"""Train a scene classifier: ``python scripts/train.py dataset=aid model=esd_mbenet backbone=resnet50``.

The same as the ``rsnet-train`` command (the code is rsnet/commands/train.py; the settings conf/, Hydra).
"""

from rsnet.commands.train import run

if __name__ == "__main__":
    run()
