package mem

// Deregister removes the region from its table (see Table.Deregister): it
// fails with ErrBusy while work requests pin the region, and once it
// returns nil no peer or local access touches the memory again.
func (r *Region) Deregister() error { return r.table.Deregister(r) }
