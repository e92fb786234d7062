"""The Redis protocol: key names, Lua scripts and value encodings.

This package is the only part of jobpulse that spells a key or a script.
"""
