"""Explaining and predicting: a latency/bandwidth model fitted to records (`wirespeed predict`) and
pairwise link measurements that name the slow host (`wirespeed links`). See docs/predict.md."""
