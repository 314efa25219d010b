package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestOutboxIsBounded: with the control plane unreachable, every Release
// waits to be sent again, up to maxRedeliveries; past that the oldest are
// dropped and counted, so a worker cut off for long keeps a bounded amount.
func TestOutboxIsBounded(t *testing.T) {
	t.Parallel()
	s := newTestServer(t) // its control plane's address refuses connections
	p := s.pool
	o := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429}
	const extra = 5
	for i := range maxRedeliveries + extra {
		_, err := p.releaseNow(t.Context(), &weirv1.ReleaseRequest{LeaseId: fmt.Sprint(i), Outcome: o})
		if !undelivered(err) {
			t.Fatalf("release %d: %v (code %v), want an error to send again", i, err, connect.CodeOf(err))
		}
	}
	queued := p.releases.queued()
	n, oldest := len(queued), queued[0].req.LeaseId
	if n != maxRedeliveries || oldest != fmt.Sprint(extra) {
		t.Errorf("outbox holds %d Releases from %s, want %d from %d", n, oldest, maxRedeliveries, extra)
	}
	var m dto.Metric
	if err := p.metrics.reportsDropped.WithLabelValues("release").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != extra {
		t.Errorf("dropped %v, want %d", got, extra)
	}
}

// TestUndelivered: what may not have reached the control plane, or found
// it unable to store, is sent again; a refusal is final.
func TestUndelivered(t *testing.T) {
	for code, want := range map[connect.Code]bool{
		connect.CodeUnavailable: true, connect.CodeDeadlineExceeded: true, connect.CodeInternal: true,
		connect.CodeUnknown: true, connect.CodeAborted: true,
		connect.CodeNotFound: false, connect.CodeInvalidArgument: false, connect.CodePermissionDenied: false,
		connect.CodeUnauthenticated: false, connect.CodeFailedPrecondition: false,
	} {
		if got := undelivered(connect.NewError(code, nil)); got != want {
			t.Errorf("undelivered(%v) = %v, want %v", code, got, want)
		}
	}
}

// outboxTest is an outbox of ints whose control plane the test scripts:
// each call takes the next of fails (nil: taken), then takes everything.
type outboxTest struct {
	out *outbox[int]

	mu          sync.Mutex
	fails       []error
	calls       []outboxCall
	dropped     int
	redelivered int
}

type outboxCall struct {
	at    time.Duration // since the test began
	items []int
	err   error
}

func newOutboxTest(batch, limit int, pace time.Duration, fails ...error) *outboxTest {
	ot := &outboxTest{fails: fails}
	start := time.Now()
	ot.out = (&outbox[int]{what: "ints", log: slog.New(slog.DiscardHandler), batch: batch, limit: limit, pace: pace,
		send: func(_ context.Context, batch []int) error {
			ot.mu.Lock()
			defer ot.mu.Unlock()
			var err error
			if len(ot.fails) > 0 {
				err, ot.fails = ot.fails[0], ot.fails[1:]
			}
			ot.calls = append(ot.calls, outboxCall{at: time.Since(start), items: slices.Clone(batch), err: err})
			return err
		},
		dropped:     func(n int) { ot.mu.Lock(); ot.dropped += n; ot.mu.Unlock() },
		redelivered: func() { ot.mu.Lock(); ot.redelivered++; ot.mu.Unlock() },
	}).start()
	return ot
}

func (ot *outboxTest) sent() []outboxCall {
	ot.mu.Lock()
	defer ot.mu.Unlock()
	return slices.Clone(ot.calls)
}

var errDown = connect.NewError(connect.CodeUnavailable, errors.New("control plane down"))

// TestOutboxBatchesAndPaces: what is queued when a call can go goes in
// it, up to batch items; calls start at most once per pace unless the
// last was full; after a quiet spell an item goes at once.
func TestOutboxBatchesAndPaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pace = time.Second
		ot := newOutboxTest(3, 100, pace)
		ot.out.put(1, 2)
		synctest.Wait()
		ot.out.put(3)
		ot.out.put(4, 5, 6, 7, 8)
		time.Sleep(10 * time.Second) // a quiet spell
		ot.out.put(9)
		synctest.Wait()
		ot.out.close(t.Context())
		want := []outboxCall{
			{at: 0, items: []int{1, 2}},
			{at: pace, items: []int{3, 4, 5}}, // paced
			{at: pace, items: []int{6, 7, 8}}, // the last was full: at once
			{at: 10 * time.Second, items: []int{9}},
		}
		if got := ot.sent(); !slices.EqualFunc(got, want, sameCall) {
			t.Errorf("calls %v, want %v", got, want)
		}
	})
}

// TestOutboxUrgentCutsThePace: an urgent item goes at once, even while
// the pace after the last call is being waited out, and takes what is
// queued with it; the pace then holds for what follows.
func TestOutboxUrgentCutsThePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pace = time.Second
		ot := newOutboxTest(10, 100, pace)
		ot.out.put(1)
		synctest.Wait()
		ot.out.put(2) // waits out the pace
		time.Sleep(pace / 4)
		ot.out.putNow(3)
		synctest.Wait()
		ot.out.put(4)
		synctest.Wait()
		time.Sleep(2 * pace)
		ot.out.close(t.Context())
		want := []outboxCall{
			{at: 0, items: []int{1}},
			{at: pace / 4, items: []int{2, 3}}, // cut short
			{at: pace/4 + pace, items: []int{4}},
		}
		if got := ot.sent(); !slices.EqualFunc(got, want, sameCall) {
			t.Errorf("calls %v, want %v", got, want)
		}
	})
}

func sameCall(a, b outboxCall) bool {
	return a.at == b.at && slices.Equal(a.items, b.items) && errors.Is(a.err, b.err)
}

// TestOutboxRedelivers: a batch the control plane did not take stays
// first in the queue and goes again, with what queued meanwhile, after a
// pause that doubles (100 ms on) up to 5 s; a refusal is final.
func TestOutboxRedelivers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := make([]error, 8)
		for i := range fails {
			fails[i] = errDown
		}
		refused := connect.NewError(connect.CodeInvalidArgument, errors.New("refused"))
		ot := newOutboxTest(10, 100, 0, append(fails, nil, refused)...)
		ot.out.put(1)
		synctest.Wait()
		ot.out.put(2)
		time.Sleep(time.Minute)
		ot.out.put(3)
		synctest.Wait()
		ot.out.put(4)
		synctest.Wait()
		ot.out.close(t.Context())

		var at time.Duration
		var want []outboxCall
		for i, wait := range []time.Duration{0, 100, 200, 400, 800, 1600, 3200, 5000, 5000} {
			at += wait * time.Millisecond
			items := []int{1, 2}
			if i == 0 {
				items = []int{1}
			}
			var err error
			if i < len(fails) {
				err = errDown
			}
			want = append(want, outboxCall{at: at, items: items, err: err})
		}
		want = append(want, outboxCall{at: time.Minute, items: []int{3}, err: refused}, outboxCall{at: time.Minute, items: []int{4}})
		if got := ot.sent(); !slices.EqualFunc(got, want, sameCall) {
			t.Errorf("calls\n%v\nwant\n%v", got, want)
		}
		if ot.redelivered != 1 {
			t.Errorf("counted %d redeliveries, want 1 (the batch taken after failed tries)", ot.redelivered)
		}
	})
}

// TestOutboxDropsOldestWhenFull: past its bound the outbox drops its
// oldest items and counts them, even one in flight.
func TestOutboxDropsOldestWhenFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ot := newOutboxTest(2, 4, 0, errDown)
		ot.out.put(1, 2)
		synctest.Wait() // 1 and 2 failed: they wait to go again
		ot.out.put(3, 4, 5)
		if got := ot.out.queued(); !slices.Equal(got, []int{2, 3, 4, 5}) {
			t.Errorf("queued %v, want [2 3 4 5]", got)
		}
		ot.out.put(6, 7)
		if ot.dropped != 3 {
			t.Errorf("dropped %d, want 3", ot.dropped)
		}
		time.Sleep(time.Second)
		ot.out.close(t.Context())
		var got []int
		for _, c := range ot.sent()[1:] {
			got = append(got, c.items...)
		}
		if !slices.Equal(got, []int{4, 5, 6, 7}) {
			t.Errorf("sent %v after the failure, want [4 5 6 7]", got)
		}
	})
}

// TestOutboxCloseDrains: close sends what is queued, cutting short a
// pause to send again; what the control plane then does not take is
// given up, not tried again.
func TestOutboxCloseDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ot := newOutboxTest(2, 100, time.Hour)
		ot.out.put(1)
		synctest.Wait()
		ot.out.put(2, 3, 4)
		ot.out.close(t.Context())
		if got := ot.sent(); len(got) != 3 || got[2].at != 0 {
			t.Errorf("calls %v, want [1] then [2 3] and [4] at once on close", got)
		}

		ot = newOutboxTest(2, 100, 0, errDown, errDown)
		ot.out.put(1)
		synctest.Wait() // failed once: waiting 100 ms to send again
		ot.out.close(t.Context())
		if got := ot.sent(); len(got) != 2 || got[1].at != 0 {
			t.Errorf("calls %v, want one try on close, at once", got)
		}
		if got := ot.out.queued(); !slices.Equal(got, []int{1}) {
			t.Errorf("queued %v after close, want [1] (given up)", got)
		}
	})
}

// TestOutboxDue: what is due when a batch goes joins it, up to batch, and
// a nudge wakes the outbox for it.
func TestOutboxDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nudge := make(chan struct{}, 1)
		var mu sync.Mutex
		due := []int{10, 11, 12}
		var calls [][]int
		out := (&outbox[int]{what: "ints", log: slog.New(slog.DiscardHandler), batch: 2, limit: 100,
			send: func(_ context.Context, batch []int) error {
				mu.Lock()
				calls = append(calls, slices.Clone(batch))
				mu.Unlock()
				return nil
			},
			due: func(n int) []int {
				mu.Lock()
				defer mu.Unlock()
				k := min(n, len(due))
				out := due[:k]
				due = due[k:]
				return out
			},
			nudge:   nudge,
			dropped: func(int) {},
		}).start()
		out.put(1)
		synctest.Wait()
		nudge <- struct{}{}
		synctest.Wait()
		out.close(t.Context())
		want := [][]int{{1, 10}, {11, 12}}
		if !slices.EqualFunc(calls, want, slices.Equal) {
			t.Errorf("calls %v, want %v", calls, want)
		}
	})
}

// TestOutboxNudgeWaitsAPace: what a nudge announces goes a pace later,
// not at once: a request that ended meanwhile (gone from due) is not
// sent, what is put meanwhile goes at once, and what is still due goes
// when the pace is up.
func TestOutboxNudgeWaitsAPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pace = 250 * time.Millisecond
		nudge := make(chan struct{}, 1)
		var mu sync.Mutex
		var due []int
		type call struct {
			batch []int
			at    time.Duration
		}
		var calls []call
		start := time.Now()
		out := (&outbox[int]{what: "ints", log: slog.New(slog.DiscardHandler), batch: 10, limit: 100, pace: pace,
			send: func(_ context.Context, batch []int) error {
				mu.Lock()
				calls = append(calls, call{slices.Clone(batch), time.Since(start)})
				mu.Unlock()
				return nil
			},
			due: func(n int) []int {
				mu.Lock()
				defer mu.Unlock()
				out := due[:min(n, len(due))]
				due = due[len(out):]
				return out
			},
			nudge:   nudge,
			dropped: func(int) {},
		}).start()
		setDue := func(v ...int) {
			mu.Lock()
			due = v
			mu.Unlock()
		}
		sent := func() []call {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(calls)
		}

		// A request registers and ends 10 ms later: its final event goes
		// at once, alone.
		setDue(10)
		nudge <- struct{}{}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if got := sent(); len(got) != 0 {
			t.Fatalf("sent %v before the pace was up", got)
		}
		setDue()
		out.put(1)
		synctest.Wait()

		// One that runs on is sent a pace after it registered.
		time.Sleep(time.Second)
		setDue(11)
		nudge <- struct{}{}
		time.Sleep(pace - time.Millisecond)
		synctest.Wait()
		if got := sent(); len(got) != 1 {
			t.Fatalf("calls %v before the pace was up, want one", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		out.close(t.Context())
		want := []call{{[]int{1}, 10 * time.Millisecond}, {[]int{11}, 1010*time.Millisecond + pace}}
		if got := sent(); !slices.EqualFunc(got, want, func(a, b call) bool { return slices.Equal(a.batch, b.batch) && a.at == b.at }) {
			t.Errorf("calls %v, want %v", got, want)
		}
	})
}
