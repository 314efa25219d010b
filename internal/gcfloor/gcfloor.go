// Package gcfloor keeps Go's garbage collector from running while the
// heap is small. With the runtime's default (GOGC=100) a process whose
// live heap is a few MB collects every few MB allocated: a gateway at a
// few hundred requests a second allocating tens of KB each then spends a
// tenth of its CPU in the collector for no memory worth having back. A
// floor lets the heap grow to at least Floor before a collection; above
// it the runtime's own pacing stands, so a heap that is large for real
// reasons (thousands of open streams) is collected as before.
//
// It works by setting the GC percent after every collection from the live
// heap the collector measured, so that the next goal is the floor, never
// less than the runtime's own (and the runtime's own until a collection
// has measured anything). A cleanup attached to an object made
// unreachable at once runs after each cycle (runtime.AddCleanup) and
// re-arms itself.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// maxPercent bounds the percent set whatever the floor asked for (the
// runtime's minimum goal bounds it first for any floor under 4 GiB).
const maxPercent = 100_000

// heapMinimum is the runtime's smallest heap goal at GOGC=100, which it
// scales with the percent (runtime/mgcpacer.go, defaultHeapMinimum).
const heapMinimum = 4 << 20

// Percent is the GC percent that makes the heap's next goal floor for a
// live heap of live bytes and roots bytes of stacks and globals, and never
// less than base (the runtime's default pacing). The runtime's goal is
// the larger of live + (live + roots) × percent/100 and heapMinimum ×
// percent/100: the percent is the larger one that keeps both within the
// floor. Before any collection has measured the live heap (live 0) it is
// base. Pure.
func Percent(live, roots, floor uint64, base int) int {
	if base < 0 || floor == 0 || live == 0 || floor <= live {
		return base
	}
	p := min((floor-live)*100/(live+roots), floor*100/heapMinimum, maxPercent)
	return max(int(p), base)
}

// Floor is a running floor; Stop ends it and puts the base percent back.
type Floor struct {
	floor   uint64
	base    int
	stopped atomic.Bool
	sample  []metrics.Sample
	mu      sync.Mutex // sample, SetGCPercent's order
	// tuned, when set, is told each percent set (tests).
	tuned func(int)
}

// Start sets a heap floor of floor bytes over the runtime's base percent
// (100 unless GOGC says otherwise). It does nothing, and returns a Floor
// whose Stop does nothing, when floor is 0 or the collector is off.
func Start(floor uint64) *Floor {
	return start(floor, nil)
}

func start(floor uint64, tuned func(int)) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	f := &Floor{floor: floor, base: base, tuned: tuned,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	if floor == 0 || base < 0 {
		f.stopped.Store(true)
		return f
	}
	f.tune()
	f.arm()
	return f
}

// arm attaches the cleanup that tunes after the next collection.
func (f *Floor) arm() {
	sentinel := new([16]byte) // not a tiny allocation: its own, collected promptly
	runtime.AddCleanup(sentinel, func(f *Floor) {
		if f.stopped.Load() {
			return
		}
		f.tune()
		f.arm()
	}, f)
}

// tune sets the percent for the live heap the last collection left.
func (f *Floor) tune() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped.Load() {
		return
	}
	metrics.Read(f.sample)
	var v [3]uint64
	for i, s := range f.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	p := Percent(v[0], v[1]+v[2], f.floor, f.base)
	debug.SetGCPercent(p)
	if f.tuned != nil {
		f.tuned(p)
	}
}

// Stop ends the floor and restores the base percent.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(f.base)
}
