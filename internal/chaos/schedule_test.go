package chaos

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

func testScheduleConfig() ScheduleConfig {
	c := Config{Duration: 15 * time.Second}
	c.defaults()
	return c.scheduleConfig(pool)
}

func TestPlanIsTheSeeds(t *testing.T) {
	t.Parallel()
	c := testScheduleConfig()
	if a, b := Plan(7, c), Plan(7, c); !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 planned twice differently:\n%v\n%v", a, b)
	}
	if a, b := Plan(7, c), Plan(8, c); reflect.DeepEqual(a, b) {
		t.Fatal("seeds 7 and 8 plan the same")
	}
}

// Every seed's schedule keeps the bounds the checks rely on.
func TestPlanBounds(t *testing.T) {
	t.Parallel()
	c := testScheduleConfig()
	kinds := map[Kind]int{}
	for seed := range uint64(300) {
		plan := Plan(seed, c)
		if len(plan) < 4 {
			t.Errorf("seed %d: only %d events", seed, len(plan))
		}
		for i, e := range plan {
			kinds[e.Kind]++
			if e.At < c.Warmup || e.End() > c.Duration-c.Quiet {
				t.Errorf("seed %d: %s outside %v..%v", seed, e, c.Warmup, c.Duration-c.Quiet)
			}
			if (e.Kind == PauseWorker || e.Kind == PauseControlPlane) && e.For > c.MaxPause {
				t.Errorf("seed %d: %s pauses longer than %v", seed, e, c.MaxPause)
			}
			if e.For > c.MaxDown {
				t.Errorf("seed %d: %s lasts longer than %v", seed, e, c.MaxDown)
			}
			if i > 0 && plan[i-1].At > e.At {
				t.Errorf("seed %d: out of order at %d", seed, i)
			}
			// At e's start (where the count of those out can rise), some
			// worker is in.
			workersOut := map[int]bool{}
			for _, o := range plan {
				if (o.Kind == KillWorker || o.Kind == PauseWorker) && o.At <= e.At && e.At < o.End() {
					workersOut[o.Target] = true
				}
			}
			for _, o := range plan {
				if o.At >= e.End() || e.At >= o.End() || o == e {
					continue
				}
				if targetKey(o) == targetKey(e) {
					t.Errorf("seed %d: %s and %s overlap on one target", seed, e, o)
				}
				if o.Kind == Upstream && e.Kind == Upstream && pool[o.Target].Anthropic == pool[e.Target].Anthropic {
					t.Errorf("seed %d: %s and %s: two accounts of a provider misbehave together", seed, e, o)
				}
			}
			if len(workersOut) >= c.Workers {
				t.Errorf("seed %d: every worker out at %s", seed, e)
			}
		}
	}
	for _, k := range Kinds {
		if kinds[k] == 0 {
			t.Errorf("no seed of 300 schedules %s", k)
		}
	}
}

func targetKey(e Event) string {
	switch e.Kind {
	case KillWorker, PauseWorker:
		return fmt.Sprint("worker", e.Target)
	case KillControlPlane, PauseControlPlane:
		return fmt.Sprint("cp", e.Target)
	case StopPostgres, CutPostgres, BlackholePostgres:
		return "postgres"
	case CutControlPlanes, BlackholeControlPlanes:
		return "cpproxy"
	case Upstream:
		return fmt.Sprint("account", e.Target)
	}
	return string(e.Kind)
}

func TestParseSeeds(t *testing.T) {
	t.Parallel()
	got, err := ParseSeeds("1-3,7")
	if err != nil || !reflect.DeepEqual(got, []uint64{1, 2, 3, 7}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "5-2", "1-"} {
		if _, err := ParseSeeds(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
