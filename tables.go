package gowarp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/gowarp/gowarp/internal/cm"
	"github.com/gowarp/gowarp/internal/mem"
)

// STag tables per network identity (capability C12).
//
// A device keeps several STag tables, each bound to a network identity:
// the default one (what Device.AllocPD uses, and every connection reaches
// unless told otherwise), one per local address (the connections that
// arrive on it or leave from it), and one per tenant name (the
// connections whose initiator names it, ConnectOptions.Tenant). A
// protection domain belongs to one table (Table.AllocPD), and so do its
// regions and queue pairs; a queue pair looks its peer's STags up in its
// own table only, and accepts only connections of that table's identity,
// so a peer of one tenant can name no region of another: its Writes,
// Reads, atomics and invalidations meet the invalid-STag Terminate.

// Errors of tables.
var (
	// ErrBadTenant: a tenant name that is empty, longer than MaxTenantLen
	// or not printable ASCII without spaces.
	ErrBadTenant = cm.ErrBadTenant
	// ErrTenantRefused: Connect named a tenant and the responder did not
	// confirm it (a peer that does not know tenants).
	ErrTenantRefused = cm.ErrTenantRefused
	// ErrWrongTable: Accept of a connection request on a queue pair of
	// another table than the request's identity calls for (see
	// ConnRequest.Table), or a connection from a local address other than
	// the queue pair's table is bound to. The request may still be
	// accepted on a queue pair of the right table, or rejected.
	ErrWrongTable = errors.New("gowarp: queue pair of another STag table than the connection's")
	// ErrNoTable: a connection request names a tenant the device has no
	// table for.
	ErrNoTable = errors.New("gowarp: no STag table for the connection's tenant")
	// ErrTableFrozen: a change to a table an export holds still (see
	// Table.Export): a registration, a deregistration, a local write.
	ErrTableFrozen = mem.ErrFrozen
	// ErrBadExport: an import stream that is corrupt, cut short, of
	// another format version, or inconsistent.
	ErrBadExport = mem.ErrBadExport
	// ErrImportSize: an imported region larger than ImportOptions.MaxBytes.
	ErrImportSize = mem.ErrImportSize
)

// MaxTenantLen is the longest tenant name.
const MaxTenantLen = cm.MaxTenantLen

// Identity is the network identity an STag table is bound to: the zero
// value is the default table's, the others are made by TenantIdentity
// and AddrIdentity. Identities are comparable.
type Identity struct {
	tenant string
	addr   netip.Addr
}

// TenantIdentity is the identity of the connections whose initiator
// names tenant (ConnectOptions.Tenant).
func TenantIdentity(tenant string) Identity { return Identity{tenant: tenant} }

// AddrIdentity is the identity of the connections that arrive on, or
// leave from, the local address a.
func AddrIdentity(a netip.Addr) Identity { return Identity{addr: a.Unmap()} }

// Tenant returns the identity's tenant name, "" if it has none.
func (id Identity) Tenant() string { return id.tenant }

// Addr returns the identity's local address; not valid if it has none.
func (id Identity) Addr() netip.Addr { return id.addr }

// IsDefault reports whether id is the default table's identity.
func (id Identity) IsDefault() bool { return id == Identity{} }

func (id Identity) String() string {
	switch {
	case id.tenant != "":
		return "tenant " + id.tenant
	case id.addr.IsValid():
		return "address " + id.addr.String()
	}
	return "default"
}

// Table is an STag table of a device, bound to one network identity.
type Table struct {
	dev *Device
	id  Identity
	t   *mem.Table
}

// tables is a device's tables; def is the default one.
type tables struct {
	mu  sync.Mutex
	def *Table
	by  map[Identity]*Table
}

func (d *Device) newTable(id Identity) *Table {
	t := &Table{dev: d, id: id, t: mem.NewTable()}
	t.t.Owner = t
	return t
}

// DefaultTable returns the device's default table: Device.AllocPD's, and
// the one a connection reaches unless a tenant name or a local address
// binds it to another.
func (d *Device) DefaultTable() *Table { return d.tables.def }

// Table returns the device's table for id, made on first use. A tenant
// name that is not valid fails with ErrBadTenant, an address that is not
// valid with ErrBadConfig.
func (d *Device) Table(id Identity) (*Table, error) {
	switch {
	case id.IsDefault():
		return d.tables.def, nil
	case id.tenant != "":
		if err := cm.CheckTenant(id.tenant); err != nil {
			return nil, err
		}
	case !id.addr.IsValid():
		return nil, fmt.Errorf("%w: identity with no address", ErrBadConfig)
	}
	d.tables.mu.Lock()
	defer d.tables.mu.Unlock()
	t := d.tables.by[id]
	if t == nil {
		if d.tables.by == nil {
			d.tables.by = make(map[Identity]*Table)
		}
		t = d.newTable(id)
		d.tables.by[id] = t
	}
	return t, nil
}

// lookupTable returns the table for id if the device has one.
func (d *Device) lookupTable(id Identity) *Table {
	if id.IsDefault() {
		return d.tables.def
	}
	d.tables.mu.Lock()
	defer d.tables.mu.Unlock()
	return d.tables.by[id]
}

// Lookup returns the valid region of the table that s names (through any
// of its keys), nil if none.
func (t *Table) Lookup(s STag) *MR {
	r, why := t.t.Lookup(mem.STag(s))
	if why != mem.OK {
		return nil
	}
	return pubMR(r)
}

// Device returns the protection domain's device.
func (pd *PD) Device() *Device { return pd.dev }

// Table returns the STag table the protection domain's regions live in.
func (pd *PD) Table() *Table { return pd.tbl }

// Identity returns the identity the table is bound to.
func (t *Table) Identity() Identity { return t.id }

// Device returns the table's device.
func (t *Table) Device() *Device { return t.dev }

// Len returns the number of regions registered in the table.
func (t *Table) Len() int { return t.t.Len() }

// AllocPD returns a new protection domain of the table: its regions are
// registered in the table, and its queue pairs look peers' STags up there.
func (t *Table) AllocPD() *PD { return &PD{dev: t.dev, tbl: t, id: t.dev.nextPD.Add(1)} }

// Listen listens on addr for connections that reach this table whatever
// their local address; a request naming another tenant than the table's
// cannot be accepted (ErrWrongTable).
func (t *Table) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return t.ListenOn(ln)
}

// ListenOn is Listen on a listener the caller opened (see Device.ListenOn).
func (t *Table) ListenOn(ln net.Listener) (*Listener, error) {
	l, err := t.dev.ListenOn(ln)
	if err != nil {
		return nil, err
	}
	l.table = t
	return l, nil
}

// Table returns the listener's table: nil when its connections reach a
// table by their identity (Device.Listen).
func (l *Listener) Table() *Table { return l.table }

// Tenant returns the tenant name the connecting peer gave
// (ConnectOptions.Tenant), "" for none.
func (r *ConnRequest) Tenant() string { return r.r.Tenant() }

// Table returns the table of the listener's device that the request's
// connection reaches, on which Accept's queue pair must be: the
// listener's own if it is bound to one (Table.Listen); else the tenant's
// table if the peer named a tenant (ErrNoTable if the device has none);
// else the table of the local address the connection arrived on, if the
// device has one; else the default table. A request read by
// ReadConnRequest has no device until Accept: it fails with ErrNoTable.
func (r *ConnRequest) Table() (*Table, error) {
	if r.ln == nil {
		return nil, fmt.Errorf("%w: a request read by ReadConnRequest has no device", ErrNoTable)
	}
	return r.tableOn(r.ln.dev)
}

func (r *ConnRequest) tableOn(d *Device) (*Table, error) {
	name := r.r.Tenant()
	if r.ln != nil && r.ln.table != nil {
		if name != "" && r.ln.table.id != TenantIdentity(name) {
			return nil, fmt.Errorf("%w: the request names tenant %q, the listener serves the %v table", ErrWrongTable, name, r.ln.table.id)
		}
		return r.ln.table, nil
	}
	if name != "" {
		t := d.lookupTable(TenantIdentity(name))
		if t == nil {
			return nil, fmt.Errorf("%w: tenant %q", ErrNoTable, name)
		}
		return t, nil
	}
	if a, ok := localIP(r.r.Conn()); ok {
		if t := d.lookupTable(AddrIdentity(a)); t != nil {
			return t, nil
		}
	}
	return d.tables.def, nil
}

// checkTable makes sure qp is of the table the request reaches.
func (r *ConnRequest) checkTable(qp *QP) error {
	// The queue pair's device decides, as a listener of one device may
	// serve the queue pairs of another.
	t := qp.table()
	want, err := r.tableOn(t.dev)
	if err != nil {
		return err
	}
	if want != t {
		return fmt.Errorf("%w: the connection reaches the %v table, the queue pair is of the %v table", ErrWrongTable, want.id, t.id)
	}
	return nil
}

// localIP returns the local IP address of a connection, if it has one.
func localIP(c net.Conn) (netip.Addr, bool) {
	if c == nil || c.LocalAddr() == nil {
		return netip.Addr{}, false
	}
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// table returns the queue pair's table.
func (qp *QP) table() *Table { return qp.q.Table().Owner.(*Table) }

// connectFrom is Connect for a queue pair whose table is bound to a local
// address: the connection leaves from it.
func (qp *QP) connectFrom(ctx context.Context, addr string, from netip.Addr, o ConnectOptions) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}}
	if o.LinkTimeout >= 0 {
		d.Timeout = o.LinkTimeout
		if d.Timeout == 0 {
			d.Timeout = DefaultLinkTimeout
		}
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		qp.Close()
		return fmt.Errorf("gowarp: connect %s from %v: %w", addr, from, err)
	}
	return qp.ConnectConn(ctx, c, o)
}

// checkLocal makes sure a connection the caller opened for qp leaves from
// the address its table is bound to, if it is.
func (qp *QP) checkLocal(c net.Conn) error {
	want := qp.table().id.addr
	if !want.IsValid() {
		return nil
	}
	if a, ok := localIP(c); !ok || a != want {
		return fmt.Errorf("%w: the connection leaves from %v, the queue pair's table is bound to %v", ErrWrongTable, c.LocalAddr(), want)
	}
	return nil
}

// ExportStats says what Table.Export wrote and how long it held the table.
type ExportStats struct {
	Regions int   // regions exported
	PDs     int   // protection domains they belong to
	Files   int   // file regions, named rather than copied
	Bytes   int64 // content bytes copied into the stream
	// Drain is how long the freeze waited for the writes in progress,
	// Copy how long writing the stream took after it.
	Drain, Copy time.Duration
}

// Export moves the table out: it freezes it, then writes to w every
// valid region with its STag, tagged offsets, access rights, protection
// domain, the semantics of each of its keys (MR.Expose), its Placed count
// and its content, in a versioned format whose every record carries a
// CRC32c. A file region (PD.RegisterFile) is not copied: its pages are
// written to the file (msync) and the stream names the file and offset,
// which Import maps again; so a file region moves only where the
// importing node sees the same file (the same host, a shared file
// system).
//
// Frozen, the table refuses every write to its regions: a peer's Write,
// atomic or Send with Invalidate meets the invalid-STag Terminate (its
// queue pair fails, and its application reconnects, to the node the table
// moves to), a local MR.WriteAt fails with ErrTableFrozen, a receive into
// one of its buffers fails its queue pair; registrations, deregistrations,
// Expose and Revoke fail with ErrTableFrozen. Reads are still served. The
// freeze waits for the writes under way (at most a second; then Export
// fails with ErrRegionBusy). After a successful export the table stays
// frozen, since a write accepted here would not reach the new node; Thaw
// resumes it (the import failed). Export may be repeated.
func (t *Table) Export(ctx context.Context, w io.Writer) (ExportStats, error) {
	st, err := t.t.Export(ctx, w, t.id.String())
	return ExportStats{Regions: st.Regions, PDs: st.PDs, Files: st.Files, Bytes: st.Bytes, Drain: st.Drain, Copy: st.Copy}, err
}

// Frozen reports whether an export holds the table still.
func (t *Table) Frozen() bool { return t.t.Frozen() }

// Thaw ends the freeze of Export: the table's regions may be written
// again.
func (t *Table) Thaw() { t.t.Thaw() }

// ImportOptions tune Table.Import.
type ImportOptions struct {
	// MaxBytes bounds one region's content (its memory is allocated as it
	// is read); 0 means 16 GiB.
	MaxBytes int64
	// OpenFile opens, read-write, the file a file region maps, by the
	// name the exporting node registered it under; nil means
	// os.OpenFile(name, os.O_RDWR, 0).
	OpenFile func(name string) (*os.File, error)
}

// Imported is what Table.Import registered.
type Imported struct {
	// From is the exporting table's identity, as it named itself.
	From string
	// PDs are the new protection domains, one per protection domain of
	// the exporting table, in the order of their regions' STags.
	PDs []*PD
	// MRs are the imported regions in STag order.
	MRs []*MR
	// Bytes is the content copied in.
	Bytes int64

	pdOf map[uint32]*PD
}

// MR returns the imported region that s names (with any of its keys),
// nil if none.
func (im *Imported) MR(s STag) *MR {
	for _, mr := range im.MRs {
		if mr.STag().Index() == s.Index() {
			return mr
		}
	}
	return nil
}

// PD returns the protection domain of the imported region s names, nil if
// none: queue pairs for the peers that held s are made in it.
func (im *Imported) PD(s STag) *PD {
	if mr := im.MR(s); mr != nil {
		return im.pdOf[mr.r.PD()]
	}
	return nil
}

// Import reads a stream that Export wrote, on this node or another, and
// registers its regions in t under the same STags and tagged offsets, with
// their rights, keys and content, in new protection domains (one per
// exporting PD): a peer that reconnects to a queue pair of one of them
// carries on with the STags it holds. Nothing is registered unless the
// whole stream is read and checks out: a corrupt, truncated or
// inconsistent stream fails with ErrBadExport, an STag whose index is in
// use in t with ErrIndexInUse, a frozen t with ErrTableFrozen.
func (t *Table) Import(ctx context.Context, r io.Reader, o ImportOptions) (*Imported, error) {
	var pds []*PD
	imp, err := t.t.Import(ctx, r, func() uint32 {
		pd := t.AllocPD()
		pds = append(pds, pd)
		return pd.id
	}, mem.ImportOptions{MaxBytes: o.MaxBytes, OpenFile: o.OpenFile})
	if err != nil {
		return nil, err
	}
	out := &Imported{From: imp.Header.Identity, PDs: pds, Bytes: imp.Bytes, pdOf: make(map[uint32]*PD, len(pds))}
	for _, pd := range pds {
		out.pdOf[pd.id] = pd
	}
	for _, r := range imp.Regions {
		out.MRs = append(out.MRs, pubMR(r))
	}
	return out, nil
}
