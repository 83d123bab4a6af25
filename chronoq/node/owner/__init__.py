"""The owner engine of a node's partitions: the tick and the timing wheel under one
``Owner``, the reaper and the schedule pump. It imports dispatch, never the gRPC edge
(import contract ``node-layers``)."""
