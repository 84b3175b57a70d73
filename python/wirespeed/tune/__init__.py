"""`wirespeed tune`: sweep a backend's knobs over sizes, each setting in a run of its own, and say
which setting is best at which sizes, by how much against the defaults, and what to export.

knobs.py is the table of knobs (one line per knob), sweep.py plans and runs the settings (every
run a checked `wirespeed bench`), verdict.py folds the records into the best setting per size
range and the `export` lines.
"""
