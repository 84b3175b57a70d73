"""`wirespeed compare`: the same benchmark over backends x dtypes x devices x world sizes, side by side.

plan.py decides which combinations can run here (and why the others cannot), runner.py runs each in
fresh processes through `wirespeed bench`, stats.py folds repeats into medians and spreads, and
render.py / plot.py turn records (live or saved) into tables, a summary and plots.
"""
