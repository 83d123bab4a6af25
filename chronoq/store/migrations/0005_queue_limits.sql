-- Cluster-wide dispatch limits per queue: a token bucket in a row, taken atomically by the
-- node that serves a claim, whichever node that is.
CREATE TABLE queue_limits (
    namespace   text             NOT NULL,
    queue       text             NOT NULL,
    rate        double precision NOT NULL,  -- tasks per second
    burst       double precision NOT NULL,
    tokens      double precision NOT NULL,
    refilled_at timestamptz      NOT NULL,
    PRIMARY KEY (namespace, queue)
);
