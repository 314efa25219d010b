package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// IdleResult is the memory of n open, silent streams through one target.
type IdleResult struct {
	Target string `json:"target"`
	N      int    `json:"n"`
	// Opened is how many streams got their first delta and stayed open.
	Opened int `json:"opened"`
	// Process is "worker" when the figures are a worker child's own RSS
	// (the stream went through that process); empty for this process.
	Process string `json:"process,omitempty"`
	// RSSGrowth is VmRSS with the streams open and idle minus VmRSS
	// before, both read after a GC and returning free memory to the OS:
	// what the open streams hold, not the garbage of opening them.
	// PeakGrowth is VmHWM, reset before opening, minus the same baseline:
	// the high-water mark of opening them all at once.
	RSSGrowth  int64 `json:"rss_growth_bytes"`
	PeakGrowth int64 `json:"peak_growth_bytes"`
	// Go's own accounting of the measured process over the same span:
	// heap and stacks in use after a GC, and goroutines.
	HeapGrowth      int64 `json:"heap_growth_bytes,omitempty"`
	StackGrowth     int64 `json:"stack_growth_bytes,omitempty"`
	GoroutineGrowth int   `json:"goroutine_growth,omitempty"`
}

// openConcurrency bounds streams being opened at once, so the listen
// backlogs are not overrun.
const openConcurrency = 256

// idleStreams opens n streams through t that the simulator holds open
// after their first delta, measures the process's memory, then closes
// them and waits for the servers to let go.
//
// m is whose memory is read: this process, or a worker child that t
// reaches (its figure is then the worker's own, with nothing to subtract).
func idleStreams(ctx context.Context, t target, n int, m meter) (IdleResult, error) {
	res := IdleResult{Target: t.name, N: n}
	settle(ctx, 0)
	goBefore, err := m.collect(ctx)
	if err != nil {
		return res, err
	}
	goroutines := runtime.NumGoroutine()
	before, err := m.read()
	if err != nil {
		return res, err
	}
	if err := m.resetPeak(); err != nil {
		return res, fmt.Errorf("reset VmHWM: %w", err)
	}

	c := loadClient()
	defer c.CloseIdleConnections()
	sctx, cancel := context.WithCancel(ctx)
	var (
		wg, ready sync.WaitGroup
		opened    atomic.Int64
		sem       = make(chan struct{}, openConcurrency)
	)
	ready.Add(n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			once := sync.OnceFunc(func() { <-sem; ready.Done() })
			defer once()
			body, ok := openHeld(sctx, c, t)
			if !ok {
				return
			}
			defer body.Close()
			opened.Add(1)
			once()
			io.Copy(io.Discard, body) //nolint:errcheck // ends when the stream is cancelled
		}()
	}
	ready.Wait()
	peak, perr := m.read()
	goAfter, cerr := m.collect(ctx)
	after, err := m.read()
	cancel()
	wg.Wait()
	c.CloseIdleConnections()
	settle(ctx, goroutines)
	if err := errors.Join(perr, cerr, err); err != nil {
		return res, err
	}
	res.Opened = int(opened.Load())
	res.HeapGrowth = goAfter.HeapInuse - goBefore.HeapInuse
	res.StackGrowth = goAfter.StackInuse - goBefore.StackInuse
	res.GoroutineGrowth = goAfter.Goroutines - goBefore.Goroutines
	res.RSSGrowth = after.rss - before.rss
	res.PeakGrowth = max(peak.hwm, after.hwm) - before.rss
	return res, nil
}

// openTimeout bounds how long a stream may take to start.
const openTimeout = 30 * time.Second

// openHeld starts one held stream and returns its body once the first
// delta arrived.
func openHeld(ctx context.Context, c *http.Client, t target) (io.ReadCloser, bool) {
	ctx, cancel := context.WithCancel(ctx)
	late := time.AfterFunc(openTimeout, cancel)
	started := false
	defer func() {
		if !started || !late.Stop() {
			cancel()
		}
	}()
	req, err := newRequest(ctx, t, streamBody)
	if err != nil {
		return nil, false
	}
	req.Header.Set(sim.StreamHeader, sim.StreamPace{Hold: true}.String())
	res, err := c.Do(req)
	if err != nil {
		return nil, false
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, false
	}
	br := bufio.NewReader(res.Body)
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, deltaLine) {
			started = true
			return readCloser{br, res.Body}, true
		}
		if err != nil && err != bufio.ErrBufferFull {
			res.Body.Close()
			return nil, false
		}
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// settle waits, up to 10 s, until at most want goroutines are left above
// those of a quiet process (servers ending closed streams, releases
// reaching the control plane); want 0 just lets a moment pass for the
// previous phase's stragglers. It polls: there is no event for "everyone
// else's goroutines ended".
func settle(ctx context.Context, want int) {
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if want > 0 && runtime.NumGoroutine() <= want+32 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if want == 0 {
			return
		}
	}
}
