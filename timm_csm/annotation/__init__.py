"""Calibrated re-annotation (CSM step 2): encoders, class prototypes, projection coefficients, soft labels."""
