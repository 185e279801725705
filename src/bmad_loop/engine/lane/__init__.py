"""The integration lane: admission, composition, verification and the compare-and-swap
advance, one run at a time, sequentially or with a speculative stack.
"""
