package bench

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// StormResult is the cost of a capacity storm: n requests held by weir
// while every account answers 529, measured over a window once they are
// all waiting.
type StormResult struct {
	N int `json:"n"`
	// Held is how many were still waiting when the window ended.
	Held   int           `json:"held"`
	Window time.Duration `json:"window_ns"`
	// CPU is this process's CPU time over the window (weir, the
	// simulator's 529s, the idle clients), Postgres its children's.
	CPU      time.Duration `json:"cpu_ns"`
	Postgres time.Duration `json:"postgres_ns"`
	// UpstreamAttempts is how many attempts reached the simulator during
	// the window: the breaker's probes and the retries it let through.
	UpstreamAttempts int `json:"upstream_attempts"`
}

// CorePercent is the window's CPU, this process and Postgres together, as
// a percentage of one core.
func (r StormResult) CorePercent() float64 {
	if r.Window <= 0 {
		return 0
	}
	return 100 * float64(r.CPU+r.Postgres) / float64(r.Window)
}

// stormRamp is how long the requests get to reach their holds (the first
// same-account overload retries, the breaker opening) before the window;
// a shorter window (a smoke run) shortens it too.
const stormRamp = 8 * time.Second

// storm makes every account answer 529, sends n requests through weir at
// once, lets them settle into their holds, and measures the CPU the held
// requests cost over window. Then it ends the storm and the requests.
func storm(ctx context.Context, st *stack, t target, n int, window time.Duration) (StormResult, error) {
	res := StormResult{N: n, Window: window}
	if err := st.overload(); err != nil {
		return res, err
	}
	defer st.simSrv.Reset()
	c := loadClient()
	defer c.CloseIdleConnections()
	sctx, cancel := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		waiting atomic.Int64
	)
	for range n {
		wg.Add(1)
		waiting.Add(1)
		go func() {
			defer wg.Done()
			defer waiting.Add(-1)
			req, err := newRequest(sctx, t, plainBody)
			if err != nil {
				return
			}
			resp, err := c.Do(req)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the wait matters
			resp.Body.Close()
		}()
	}
	select {
	case <-ctx.Done():
		cancel()
		wg.Wait()
		return res, ctx.Err()
	case <-time.After(min(stormRamp, window)):
	}
	attempts := len(st.simSrv.Attempts())
	before := readCPU()
	time.Sleep(window) //nolint:forbidigo // the measurement is of time passing while requests wait
	cpu := readCPU().sub(before)
	res.CPU, res.Postgres = cpu.self, cpu.children
	res.Held = int(waiting.Load())
	res.UpstreamAttempts = len(st.simSrv.Attempts()) - attempts
	cancel()
	wg.Wait()
	return res, nil
}

// overload makes every Anthropic account answer 529 until the simulator's
// Reset.
func (s *stack) overload() error {
	for i := range s.creds {
		if err := s.simSrv.AddFaults(accountName(i), sim.Fault{Kind: sim.FaultOverloaded, Times: -1}); err != nil {
			return err
		}
	}
	return nil
}
