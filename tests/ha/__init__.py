"""A replicated store under Patroni: failover, fencing, unconfirmed commits."""
