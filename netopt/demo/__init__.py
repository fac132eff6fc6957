"""``netopt demo``: the whole system on an emulated two-region cluster."""
