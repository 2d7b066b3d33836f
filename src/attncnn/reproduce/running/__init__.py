"""Running any study: its jobs and their states (:mod:`.jobs`), training them one after another
(:mod:`.runner`), a grid's measurements before it trains (:mod:`.measurements`, validated on
held-out images: :mod:`.held_out`), and what the report reads of its runs: the machines that
trained their epochs (:mod:`.machines`) and how far an unfinished run got (:mod:`.unfinished`)."""
