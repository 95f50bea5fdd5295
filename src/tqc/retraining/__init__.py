"""The retrain flow's steps by concern; `tqc.retrain` is the flow's view of them."""
