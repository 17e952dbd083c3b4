"""Hooks the collector installs into the training process only while a window is open."""
