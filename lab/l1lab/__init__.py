"""The lab's tools: studies of the product's measurements (run-to-run spread, per-stage wall
time, re-timing a task list, results brought back from a GPU node). They import the product
(``l1bench``); the product never imports them."""
