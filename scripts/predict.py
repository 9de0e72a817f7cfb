"""Classify a folder of images:
``python scripts/predict.py checkpoint=outputs/run/checkpoints/last.pt images=my_scenes/``.

The same as the ``rsnet-predict`` command (the code, and every option, is in rsnet/commands/predict.py).
"""

from rsnet.commands.predict import run

if __name__ == "__main__":
    run()
