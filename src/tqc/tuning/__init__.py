"""`tqc tune`'s parts; `tqc.tune.tune` runs them."""
