"""Sandbox backends (docker, bwrap) for envs that run commands."""
