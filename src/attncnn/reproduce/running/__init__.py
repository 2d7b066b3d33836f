"""Running any study: its jobs, their states and training them one after another (:mod:`.runner`),
how long that takes here (:mod:`.estimate`), a grid's measurements before it trains and what they
found (:mod:`.measurements`, validated on held-out images), and what the report reads of its runs:
the machines that trained their epochs and how far an unfinished run got (:mod:`.machines`)."""
