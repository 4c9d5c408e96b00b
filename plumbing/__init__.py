"""Plumbing the paper's path stands on: checkpoints (ckpt), process groups and precision (parallel), task
loading and batch order (tasks), ALFWorld game generation (gamegen), the offline tiny model (tiny), WebShop
(webshop), the run's logs, summaries and tables (report)."""
