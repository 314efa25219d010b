package gcfloor

import (
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// TestPercent: the goal the percent gives reaches the floor and no
// further than it must, and never falls below the base.
func TestPercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	goal := func(live, roots uint64, p int) uint64 {
		return max(live+(live+roots)*uint64(p)/100, heapMinimum*uint64(p)/100)
	}
	for range 100_000 {
		live := uint64(rng.Int64N(1<<32)) + 1
		roots := uint64(rng.Int64N(1 << 22))
		floor := uint64(rng.Int64N(1 << 32))
		base := []int{100, 50, 200}[rng.IntN(3)]
		p := Percent(live, roots, floor, base)
		switch {
		case p < base:
			t.Fatalf("Percent(%d, %d, %d, %d) = %d, below the base", live, roots, floor, base, p)
		case p == base:
			if goal(live, roots, p+1) <= floor && goal(live, roots, base) < floor-(live+roots)/100-heapMinimum/100 {
				t.Fatalf("Percent(%d, %d, %d, %d) = the base, though more reaches the floor", live, roots, floor, base)
			}
		case goal(live, roots, p)+(live+roots)/100+heapMinimum/100+1 < floor:
			t.Fatalf("Percent(%d, %d, %d, %d) = %d: goal %d short of the floor", live, roots, floor, base, p, goal(live, roots, p))
		case p > base && goal(live, roots, p) > floor:
			t.Fatalf("Percent(%d, %d, %d, %d) = %d: goal %d past the floor", live, roots, floor, base, p, goal(live, roots, p))
		}
	}
	for _, tc := range []struct {
		name               string
		live, roots, floor uint64
		base, want         int
	}{
		{"nothing measured yet: the runtime's own", 0, 0, 64 << 20, 100, 100},
		{"no floor", 1 << 20, 0, 0, 100, 100},
		{"collector off", 1 << 20, 0, 64 << 20, -1, -1},
		{"4 MiB live under a 64 MiB floor", 4 << 20, 0, 64 << 20, 100, 1500},
		{"with 1 MiB of roots", 4 << 20, 1 << 20, 64 << 20, 100, 1200},
		{"a tiny live heap: the runtime's minimum, scaled, binds", 150 << 10, 300 << 10, 48 << 20, 100, 1200},
		{"over the floor", 40 << 20, 0, 64 << 20, 100, 100},
	} {
		if got := Percent(tc.live, tc.roots, tc.floor, tc.base); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// currentPercent reads the GC percent without changing it.
func currentPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestFloorFollowsTheLiveHeap: after each collection the percent is set
// from what is live: raised while the heap is under the floor, the base
// once it is over it; Stop puts the base back.
func TestFloorFollowsTheLiveHeap(t *testing.T) {
	base := currentPercent()
	tuned := make(chan int, 16)
	f := start(256<<20, func(p int) {
		select {
		case tuned <- p:
		default:
		}
	})
	defer f.Stop()
	next := func() int {
		t.Helper()
		for {
			runtime.GC()
			select {
			case p := <-tuned:
				return p
			case <-time.After(5 * time.Second): // a cleanup runs after a cycle; another cycle, then
			}
		}
	}
	<-tuned // Start's own
	if p := next(); p <= base {
		t.Fatalf("a small heap under a 256 MiB floor: percent %d, want above %d", p, base)
	}
	if currentPercent() <= base {
		t.Fatalf("percent %d not set", currentPercent())
	}
	held := make([]byte, 300<<20) // live past the floor
	for range 3 {
		if p := next(); p == base {
			break
		}
	}
	if p := currentPercent(); p != base {
		t.Fatalf("a 300 MiB live heap over a 256 MiB floor: percent %d, want the base %d", p, base)
	}
	runtime.KeepAlive(held)
	f.Stop()
	if p := currentPercent(); p != base {
		t.Fatalf("after Stop: percent %d, want %d", p, base)
	}
}

// heapGoal is the runtime's current heap goal.
func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var sink []byte

// TestFloorBoundsTheHeap: however much garbage a process makes, it
// collects every floor's worth or so, and once a quiet collection has
// measured the live heap the goal is the floor. (The goal while the
// garbage is made is no measure: a cycle counts as live what was
// allocated while it marked, and this loop allocates gigabytes a second
// on a machine other tests share. Without the runtime's minimum in the
// percent the goal was over 600 MiB and the loop collected once.)
func TestFloorBoundsTheHeap(t *testing.T) {
	const floor = 48 << 20
	runtime.GC() // what the other tests left live is not
	tuned := make(chan int, 1)
	f := start(floor, func(p int) {
		select {
		case tuned <- p:
		default:
		}
	})
	defer f.Stop()
	cycles := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := cycles()
	for range 400_000 { // 400 MiB of garbage, 1 KiB at a time
		sink = make([]byte, 1<<10)
	}
	if n := cycles() - before; n < 4 {
		t.Errorf("%d collections for 400 MiB of garbage under a 48 MiB floor", n)
	}
	sink = nil
	for { // a collection with nothing allocated beside it, and its tuning
		select {
		case <-tuned:
		default:
		}
		runtime.GC()
		select {
		case <-tuned:
		case <-time.After(5 * time.Second): // tuned by an earlier cycle's cleanup: again
			continue
		}
		break
	}
	if g := heapGoal(); g > floor+floor/8 {
		t.Errorf("heap goal %d MiB after a quiet collection under a %d MiB floor (percent %d)", g>>20, floor>>20, currentPercent())
	}
}

// TestFloorOff: no floor, or the collector off, leaves the percent alone.
func TestFloorOff(t *testing.T) {
	base := currentPercent()
	f := Start(0)
	runtime.GC()
	if p := currentPercent(); p != base {
		t.Fatalf("floor 0 changed the percent to %d", p)
	}
	f.Stop()
	old := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(old)
	f = Start(64 << 20)
	if p := currentPercent(); p != -1 {
		t.Fatalf("GOGC=off turned into %d", p)
	}
	f.Stop()
	if p := currentPercent(); p != -1 {
		t.Fatalf("Stop of an idle floor set %d", p)
	}
}
