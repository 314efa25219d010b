package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/weirhq/weir/controlplane/db"
)

// Sample is the soak's process at one moment.
type Sample struct {
	// At is from the start of traffic; Storm says a storm was on.
	At    time.Duration `json:"at_ns"`
	Storm bool          `json:"storm,omitempty"`
	// Goroutines and FDs (entries of /proc/self/fd) of this process.
	Goroutines int `json:"goroutines"`
	FDs        int `json:"fds"`
	// HeapInuse is Go's heap in use after a GC; RSS is VmRSS read after
	// it, the freed memory returned to the OS.
	HeapInuse int64 `json:"heap_inuse_bytes"`
	RSS       int64 `json:"rss_bytes"`
	// LiveLeases are the leases not expired in Postgres; PGInUse and
	// PGOpen the control plane's pool connections acquired and open.
	LiveLeases int   `json:"live_leases"`
	PGInUse    int32 `json:"pg_in_use"`
	PGOpen     int32 `json:"pg_open"`
	// CPU and PGCPU are the cores this process and Postgres used since
	// the previous sample; Load the machine's one-minute load average (a
	// shared machine starves the soak of CPU as much as weir could).
	CPU   float64 `json:"cpu_cores"`
	PGCPU float64 `json:"pg_cpu_cores"`
	Load  float64 `json:"load"`
	// OK, Cancelled and Failed count the requests that ended since the
	// previous sample; InFlight those open at this one.
	OK        int `json:"ok"`
	Cancelled int `json:"cancelled"`
	Failed    int `json:"failed"`
	InFlight  int `json:"in_flight"`
}

// sample reads the process; full collects the garbage first and reads
// the heap (a GC costs a few milliseconds of a busy process: only the
// recorded samples pay it, not the settling polls).
func (s *soak) sample(ctx context.Context, full bool) (Sample, error) {
	var sm Sample
	if full {
		sm.HeapInuse = collectGo().HeapInuse
	}
	sm.Goroutines = runtime.NumGoroutine()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return sm, fmt.Errorf("count descriptors: %w", err)
	}
	sm.FDs = len(fds)
	m, err := readMem("/proc/self/status")
	if err != nil {
		return sm, err
	}
	sm.RSS = m.rss
	ps := s.st.pool.Stat()
	sm.PGInUse, sm.PGOpen = ps.AcquiredConns(), ps.TotalConns()
	live, err := db.New(s.pg).LiveLeaseCounts(ctx, time.Now())
	if err != nil {
		return sm, fmt.Errorf("count live leases: %w", err)
	}
	for _, r := range live {
		sm.LiveLeases += int(r.Live)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			sm.Load, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return sm, nil
}

// cpuSince fills sm's CPU use from what was used at prev, at time from.
func (sm *Sample) cpuSince(prev cpuTimes, from time.Time) cpuTimes {
	now := readCPU()
	if wall := time.Since(from); wall > 0 {
		used := now.sub(prev)
		sm.CPU, sm.PGCPU = float64(used.self)/float64(wall), float64(used.children)/float64(wall)
	}
	return now
}

// exercised reads from weir's metrics what the run made it do.
func exercised(st *stack, s *soak) []Count {
	var dps []*prometheus.Registry
	for _, w := range st.workers {
		dps = append(dps, w.reg)
	}
	cps := []*prometheus.Registry{st.cpReg}
	out := []Count{
		{"storms", int64(len(s.storms))},
		{"429 bursts scripted", int64(s.rateLimits)},
		{"upstream 529s (attempts)", counter(dps, "weir_dataplane_upstream_attempts_total", "reason", "overloaded")},
		{"upstream 429s (attempts)", counter(dps, "weir_dataplane_upstream_attempts_total", "reason", "rate_limited")},
		{"holds", counter(dps, "weir_dataplane_holds_total", "", "")},
		{"breaker opens", counter(cps, "weir_controlplane_breaker_opens_total", "", "")},
		{"breaker probes", counter(cps, "weir_controlplane_breaker_probes_total", "", "")},
		{"rate_limited cooldowns written", counter(cps, "weir_controlplane_cooldowns_written_total", "reason", "rate_limited")},
		{"leases reused", counter(dps, "weir_dataplane_lease_pool_total", "result", "reused")},
		{"leases acquired", counter(dps, "weir_dataplane_lease_pool_total", "result", "acquired")},
		{"requests queued for a lease (4 Acquires of their class in flight)", counter(dps, "weir_dataplane_lease_pool_total", "result", "queued")},
		{"held requests' shared no-account answers", counter(dps, "weir_dataplane_lease_pool_total", "result", "shared_none")},
		{"requests cancelled by the client (weir's count)", counter(dps, "weir_dataplane_requests_total", "outcome", "canceled")},
	}
	for i, w := range st.workers {
		out = append(out, Count{fmt.Sprintf("requests served by worker %d", i+1),
			counter([]*prometheus.Registry{w.reg}, "weir_dataplane_requests_total", "outcome", "success")})
	}
	return out
}

// counter sums a counter over registries, over the series whose label has
// value (every series when label is "").
func counter(regs []*prometheus.Registry, name, label, value string) int64 {
	var sum float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if label == "" || hasLabel(m.GetLabel(), label, value) {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int64(sum)
}

func hasLabel(ls []*dto.LabelPair, name, value string) bool {
	for _, l := range ls {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
