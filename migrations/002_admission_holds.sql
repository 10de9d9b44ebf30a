-- "Lease" names one thing only: the leader lease. What the admission ledger hands out while an
-- operation that may touch a binding is in flight is an admission *hold*.
ALTER TABLE admission_leases RENAME TO admission_holds;
