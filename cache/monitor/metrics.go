package monitor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gowarp/gowarp/cache"
)

const namespace = "gowarp_cache"

// The metrics read from the server's counters at each scrape. The server
// keeps its own counters (its stats op serves them too); reading them at
// scrape time counts nothing twice and costs the server's hot path nothing.
var (
	descOps      = desc("ops_total", "Operations done, by kind (gets include lookups).", "op")
	descHits     = desc("hits_total", "Gets and lookups that found their key.")
	descMisses   = desc("misses_total", "Gets and lookups that did not find their key.")
	descBytes    = desc("value_bytes_total", "Value bytes carried through the server: in (put), out (got inline).", "direction")
	descPaging   = desc("paging_total", "Blocks paged in from their files, or out to them.", "direction")
	descDurable  = desc("durable_puts_total", "Puts acknowledged once on stable storage.")
	descKeys     = desc("keys", "Values stored.")
	descStored   = desc("stored_bytes", "Bytes of values stored.")
	descBlocks   = desc("blocks", "Blocks in the data directory.")
	descResident = desc("resident_blocks", "Blocks in memory (mapped and registered for RDMA).")
	descBudget   = desc("budget_bytes", "Bytes of blocks allowed in memory at once.")
	descBlock    = desc("block_size_bytes", "Bytes of one block.")
	descClients  = desc("clients", "Clients (queue pairs) connected.")

	// The client-readable index (all zero when the server serves none).
	descIdxBuckets  = desc("index_buckets", "Buckets of the client-readable index.")
	descIdxEntries  = desc("index_entries", "Buckets of the client-readable index holding a key.")
	descIdxUpdates  = desc("index_updates_total", "Index buckets written (each bumps the index's sequence number).")
	descIdxRemoves  = desc("index_removes_total", "Index buckets cleared.")
	descIdxOverflow = desc("index_overflow_total", "Values left out of the index: key too long, several pieces, neighbourhood full.")
	descIdxReads    = desc("index_reads_total", "Clients' one-sided RDMA Reads of the index: lookups that needed no control-path request.")
	descIdxMisses   = desc("index_misses_total", "Lookups of clients reading the index that the index did not answer and the control path did.")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
}

type statsCollector struct{ stats func() cache.Stats }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOps, descHits, descMisses, descBytes, descPaging, descDurable,
		descKeys, descStored, descBlocks, descResident, descBudget, descBlock, descClients,
		descIdxBuckets, descIdxEntries, descIdxUpdates, descIdxRemoves, descIdxOverflow, descIdxReads, descIdxMisses} {
		ch <- d
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(descOps, s.Gets, "get")
	counter(descOps, s.Puts, "put")
	counter(descOps, s.Deletes, "delete")
	counter(descHits, s.Hits)
	counter(descMisses, s.Misses)
	counter(descBytes, s.BytesIn, "in")
	counter(descBytes, s.BytesOut, "out")
	counter(descPaging, s.PageIns, "in")
	counter(descPaging, s.PageOuts, "out")
	counter(descDurable, s.DurablePuts)
	gauge(descKeys, s.Keys)
	gauge(descStored, s.Bytes)
	gauge(descBlocks, s.Blocks)
	gauge(descResident, s.Resident)
	gauge(descBudget, s.Budget)
	gauge(descBlock, s.BlockSize)
	gauge(descClients, s.Conns)
	gauge(descIdxBuckets, s.IndexBuckets)
	gauge(descIdxEntries, s.IndexEntries)
	counter(descIdxUpdates, s.IndexUpdates)
	counter(descIdxRemoves, s.IndexRemoves)
	counter(descIdxOverflow, s.IndexOverflow)
	counter(descIdxReads, s.IndexReads)
	counter(descIdxMisses, s.IndexMisses)
}

func registerAll(reg *prometheus.Registry, cs ...prometheus.Collector) error {
	cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
