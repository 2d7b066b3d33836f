"""Running any study: its jobs and their states (:mod:`.jobs`), training them one after another
(:mod:`.runner`, which records each epoch's machine: :mod:`.machines`), a grid's measurements before
it trains (:mod:`.measurements`, validated on held-out images: :mod:`.held_out`), and preparing
run folders for committing (:mod:`.ship`: finished ones trimmed; :mod:`.unfinished`: unfinished
ones made to resume elsewhere)."""
