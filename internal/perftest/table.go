package perftest

import (
	"fmt"
	"io"
	"strings"
)

// ResultLine is perftest's rule.
const ResultLine = "---------------------------------------------------------------------------------------"

// cHex formats v as C's printf("%#0*x", width, v): zero has no 0x, and
// the width counts the prefix.
func cHex(v uint64, width int) string {
	if v == 0 {
		return strings.Repeat("0", width)
	}
	h := fmt.Sprintf("%x", v)
	if pad := width - 2 - len(h); pad > 0 {
		h = strings.Repeat("0", pad) + h
	}
	return "0x" + h
}

// addressLines are perftest's "local address" lines for d (its GID is
// printed byte by byte in decimal, as perftest does).
func addressLines(side string, d *Dest, rdma bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, " %s address: LID %s QPN %s PSN %s", side, cHex(uint64(d.LID), 4), cHex(uint64(d.QPN), 6), cHex(uint64(d.PSN), 6))
	if rdma {
		fmt.Fprintf(&b, " RKey %s VAddr %s", cHex(uint64(d.RKey), 8), cHex(d.VAddr, 16))
	}
	b.WriteString("\n GID: ")
	for i, g := range d.GID {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02d", g)
	}
	b.WriteByte('\n')
	return b.String()
}

// WriteTable prints r in perftest's layout: the header block, both
// addresses, the result table. o is the run's options (after Run or
// Serve filled in the defaults); extra lines, if any, follow the table.
func (r *Result) WriteTable(w io.Writer, o *Options) {
	onOff := map[bool]string{false: "OFF", true: "ON"}
	fmt.Fprintln(w, ResultLine)
	title := r.Test.Title()
	if o.Duplex {
		title = strings.Replace(title, " BW ", " Bidirectional BW ", 1)
	}
	fmt.Fprintf(w, "                    %s\n", title)
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : gowarp\n")
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IW\n", max(o.QPs, 1))
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	if !r.Server || r.Test.Latency() {
		fmt.Fprintf(w, " TX depth        : %d\n", o.TxDepth)
	}
	if (r.Test == SendBW && r.Server) || r.Test == SendLat {
		fmt.Fprintf(w, " RX depth        : %d\n", o.RxDepth)
	}
	fmt.Fprintf(w, " Mtu             : 1024[B]\n")
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if r.Test == ReadBW || r.Test == ReadLat {
		fmt.Fprintf(w, " Outstand reads  : %d\n", MaxOutReads)
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : ON\n")
	fmt.Fprintf(w, " Data ex. method : rdma_cm\n")
	rev := o.Connect.MPARevision
	if rev == 0 {
		rev = 2
	}
	fmt.Fprintf(w, " MPA             : revision %d, CRC %s (asked; the peer may turn it on)\n", rev, onOff[o.Connect.CRC])
	fmt.Fprintf(w, " Peer            : perftest %s\n", r.PeerVersion)
	fmt.Fprintln(w, ResultLine)
	rdma := r.Test != SendBW && r.Test != SendLat
	// perftest prints every queue pair's: this side's, then the peer's.
	for _, side := range []struct {
		name  string
		dests []Dest
	}{{"local", r.LocalDests}, {"remote", r.RemoteDests}} {
		for i := range side.dests {
			fmt.Fprint(w, addressLines(side.name, &side.dests[i], rdma))
		}
	}
	fmt.Fprintln(w, ResultLine)
	switch {
	case r.Test == ReadLat && r.Server:
		fmt.Fprintln(w, " the read_lat client measures; this server answered its Reads")
	case r.Test.Latency():
		if r.Lat.Sampled {
			fmt.Fprintln(w, LatResultHeaderSampled)
		} else {
			fmt.Fprintln(w, LatResultHeader)
		}
		if len(r.LatSizes) == 0 {
			fmt.Fprintln(w, r.Lat.Line())
		}
		for i := range r.LatSizes {
			fmt.Fprintln(w, r.LatSizes[i].Line())
		}
	case o.Duplex:
		// Both sides print the sum of their reports.
		fmt.Fprintln(w, resultHeader(o.Gbits))
		// perftest picks six decimals by this side's own average,
		// before it adds the peer's (siw's ib_write_bw -b -q 4
		// --report_gbits printed 0.361633 for 0.04 of its own).
		own, sums := r.duplexLines()
		for i := range sums {
			fmt.Fprintln(w, sums[i].line(o.Gbits && own[i].BWAvg < 0.1))
		}
	case r.Server && r.Test != SendBW:
		// perftest's write_bw and read_bw servers print the client's report.
		fmt.Fprintln(w, resultHeader(o.Gbits))
		fmt.Fprintln(w, r.Remote.Line(o.Gbits))
	case len(r.Sizes) > 0:
		fmt.Fprintln(w, resultHeader(o.Gbits))
		for i := range r.Sizes {
			fmt.Fprintln(w, r.Sizes[i].Line(o.Gbits))
		}
	default:
		fmt.Fprintln(w, resultHeader(o.Gbits))
		fmt.Fprintln(w, r.Local.Line(o.Gbits))
	}
	fmt.Fprintln(w, ResultLine)
	switch {
	case o.Duplex:
		fmt.Fprintln(w, " (both ways together: this side's figures and the peer's, added, as perftest prints them)")
	case r.Server && (r.Test == WriteBW || r.Test == ReadBW):
		fmt.Fprintln(w, " (the client's figures, as perftest's server prints them; the server measures nothing)")
	case !r.Server && r.Test == SendBW:
		fmt.Fprintln(w, " (the send_bw server measured the receive side itself and printed its figures there)")
	case !r.Server && (r.Test == WriteBW || r.Test == ReadBW) && r.Remote.Measured(o.Size):
		fmt.Fprintln(w, " server's report:")
		fmt.Fprintln(w, r.Remote.Line(o.Gbits))
	}
}

// WriteOutput prints what perftest's --output prints instead of the table
// (o.Output): for each report WriteTable's lines show, its average
// bandwidth or its message rate, or a latency test's average latency, one
// number a line ("%lf"). read_lat's client prints a rule first, as
// perftest's does; a side that measures and shows nothing prints nothing.
func (r *Result) WriteOutput(w io.Writer, o *Options) {
	if o.Test.Latency() {
		if r.Test == ReadLat && r.Server {
			return
		}
		if r.Test == ReadLat {
			fmt.Fprintln(w, ResultLine)
		}
		lats := r.LatSizes
		if len(lats) == 0 {
			lats = []LatReport{r.Lat}
		}
		for _, l := range lats {
			fmt.Fprintf(w, "%f\n", l.Avg)
		}
		return
	}
	var reps []Report
	switch {
	case o.Duplex:
		_, reps = r.duplexLines()
	case r.Server && r.Test != SendBW:
		reps = []Report{r.Remote}
	case len(r.Sizes) > 0:
		reps = r.Sizes
	default:
		reps = []Report{r.Local}
	}
	for _, rep := range reps {
		v := rep.BWAvg
		if o.Output == "message_rate" {
			v = rep.MsgRateMpps
		}
		fmt.Fprintf(w, "%f\n", v)
	}
}

// Duplex returns what a bidirectional run prints (perftest's
// print_full_bw_report with both reports): this side's size and count,
// and both sides' figures added.
func (r *Result) Duplex() Report { return addReports(r.Local, r.Remote) }

// duplexLines returns what a bidirectional run's lines show: this side's
// report of each size (one without --all) and the sum with the peer's.
func (r *Result) duplexLines() (own, sums []Report) {
	if len(r.Sizes) == 0 || len(r.RemoteSizes) != len(r.Sizes) {
		return []Report{r.Local}, []Report{r.Duplex()}
	}
	sums = make([]Report, len(r.Sizes))
	for i := range r.Sizes {
		sums[i] = addReports(r.Sizes[i], r.RemoteSizes[i])
	}
	return r.Sizes, sums
}

// addReports is local with remote's figures added to its own.
func addReports(local, remote Report) Report {
	local.BWPeak += remote.BWPeak
	local.BWAvg += remote.BWAvg
	local.MsgRateMpps += remote.MsgRateMpps
	return local
}

// JSON returns the result as a flat object for -json.
func (r *Result) JSON(o *Options) map[string]any {
	role := "client"
	if r.Server {
		role = "server"
	}
	out := map[string]any{"test": r.Test, "role": role, "peer_version": r.PeerVersion,
		"crc_asked": o.Connect.CRC}
	unit := "MBps"
	if o.Gbits {
		unit = "Gbps"
	}
	if o.QPs > 1 {
		out["qps"] = o.QPs
	}
	bw := func(rep *Report) map[string]any {
		return map[string]any{"size": rep.Size, "iters": rep.Iters,
			"bw_peak_" + unit: rep.BWPeak, "bw_avg_" + unit: rep.BWAvg, "msg_rate_Mpps": rep.MsgRateMpps}
	}
	switch {
	case r.Test == ReadLat && r.Server:
		out["size"], out["iters"] = o.Size, o.Iters
	case r.Test.Latency():
		lat := func(l *LatReport) map[string]any {
			if l.Sampled {
				return map[string]any{"avg": l.Avg, "tps": l.TPS}
			}
			return map[string]any{"min": l.Min, "max": l.Max, "typical": l.Typical,
				"avg": l.Avg, "stdev": l.Stdev, "p99": l.P99, "p99_9": l.P999}
		}
		out["size"], out["iters"] = r.Lat.Size, r.Lat.Iters
		out["latency_usec"] = lat(&r.Lat)
		if len(r.LatSizes) > 0 {
			sizes := make([]map[string]any, len(r.LatSizes))
			for i := range r.LatSizes {
				l := &r.LatSizes[i]
				sizes[i] = map[string]any{"size": l.Size, "iters": l.Iters, "latency_usec": lat(l)}
			}
			out["sizes"] = sizes
		}
	case o.Duplex:
		sum := r.Duplex()
		for k, v := range bw(&sum) {
			out[k] = v
		}
		out["local_report"], out["peer_report"] = bw(&r.Local), bw(&r.Remote)
		if _, sums := r.duplexLines(); len(r.RemoteSizes) > 0 && len(sums) == len(r.RemoteSizes) {
			sizes := make([]map[string]any, len(sums))
			for i := range sums {
				sizes[i] = bw(&sums[i])
			}
			out["sizes"] = sizes
		}
	case r.Server && r.Test != SendBW:
		out["size"], out["iters"] = r.Remote.Size, r.Remote.Iters
		out["client_report"] = bw(&r.Remote)
	default:
		for k, v := range bw(&r.Local) {
			out[k] = v
		}
		if !r.Server && r.Test != SendBW && r.Remote.Measured(o.Size) {
			out["server_report"] = bw(&r.Remote)
		}
		if len(r.Sizes) > 0 {
			sizes := make([]map[string]any, len(r.Sizes))
			for i := range r.Sizes {
				sizes[i] = bw(&r.Sizes[i])
			}
			out["sizes"] = sizes
		}
	}
	return out
}
