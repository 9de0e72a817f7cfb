"""Hydra configs, installed as package data (``config_path="pkg://rsnet.conf"``); kept at the top of the checkout."""
