package dataplane

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// gateTest is a gate on the bubble's clock and a control plane whose
// answers the test sets.
type gateTest struct {
	gate  *classGate
	calls atomic.Int32

	mu     sync.Mutex
	counts map[string]int
	whys   []string
	sinces []time.Time
	answer func(why string) (*weirv1.AcquireResponse, error)
}

func newGateTest() *gateTest {
	gt := &gateTest{counts: map[string]int{}}
	gt.gate = newClassGate(time.Now, sleepCtx, func(what string) {
		gt.mu.Lock()
		gt.counts[what]++
		gt.mu.Unlock()
	})
	return gt
}

func (gt *gateTest) call(ctx context.Context, why string, since time.Time) (*weirv1.AcquireResponse, error) {
	gt.calls.Add(1)
	gt.mu.Lock()
	gt.whys = append(gt.whys, why)
	gt.sinces = append(gt.sinces, since)
	answer := gt.answer
	gt.mu.Unlock()
	return answer(why)
}

func (gt *gateTest) answerWith(f func(why string) (*weirv1.AcquireResponse, error)) {
	gt.mu.Lock()
	gt.answer = f
	gt.mu.Unlock()
}

func (gt *gateTest) count(what string) int {
	gt.mu.Lock()
	defer gt.mu.Unlock()
	return gt.counts[what]
}

func refusal(retryIn time.Duration) *weirv1.AcquireResponse {
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: &weirv1.NoAccount{
		Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY, Message: "busy", RetryAt: timestamppb.New(time.Now().Add(retryIn)),
	}}}
}

func granted(id string) *weirv1.AcquireResponse {
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: &weirv1.Lease{Id: id, AccountId: "a"}}}
}

// refuse has the control plane refuse the class once, so that it counts
// as refused; the asking request gets the answer as it was given.
func (gt *gateTest) refuse(t *testing.T, retryIn time.Duration) {
	t.Helper()
	gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return refusal(retryIn), nil })
	resp, _, err := gt.gate.ask(t.Context(), gateRequest{class: testClass}, gt.call)
	if err != nil || resp.GetNoAccount() == nil {
		t.Fatalf("first ask: %v, %v; want the refusal", resp, err)
	}
}

// TestGateManyHeldRequestsOneCall: the held requests of a refused class
// park on it and one of them asks for all when the shared answer runs
// out; its lease is its own, and the rest are let go to ask as usual.
func TestGateManyHeldRequestsOneCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		gt.refuse(t, time.Second)
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return granted("l"), nil })
		const held = 50
		var wg sync.WaitGroup
		var leases, again atomic.Int32
		start := time.Now()
		for i := range held {
			wg.Go(func() {
				// Each began to wait at its own time; the one call for all
				// asks in the turn of the one that waited longest.
				since := start.Add(-time.Duration(i+1) * time.Second)
				resp, parked, err := gt.gate.ask(t.Context(), gateRequest{class: testClass, held: true, holdEnd: time.Now().Add(time.Minute), since: since}, gt.call)
				switch {
				case err != nil:
					t.Errorf("ask: %v", err)
				case resp.GetLease() != nil:
					leases.Add(1)
				case resp == nil:
					again.Add(1)
				}
				if parked != time.Second {
					t.Errorf("parked %v, want 1s: until the shared answer ran out", parked)
				}
			})
		}
		synctest.Wait()
		if n := gt.calls.Load(); n != 1 {
			t.Errorf("%d calls while the refusal stands, want the first only", n)
		}
		wg.Wait()
		if n := gt.calls.Load(); n != 2 {
			t.Errorf("%d calls for %d held requests, want 2 (the refusal, then one for all)", n, held)
		}
		if leases.Load() != 1 || again.Load() != held-1 {
			t.Errorf("%d leases and %d let go, want 1 and %d", leases.Load(), again.Load(), held-1)
		}
		if gt.whys[1] != askForAll {
			t.Errorf("the held requests' call was counted as %q, want %q", gt.whys[1], askForAll)
		}
		if want := start.Add(-held * time.Second); !gt.sinces[1].Equal(want) {
			t.Errorf("the call for all asked in the turn of a request waiting since %v, want the longest's, %v", gt.sinces[1], want)
		}
	})
}

// TestGateSharedRefusalUntilRetryTime: a held request whose hold is over
// gets the class's refusal without a call until its retry time (clamped
// to at least noneMin), and asks after it; requests that are not held
// wait for the one call in flight and share its answer.
func TestGateSharedRefusalUntilRetryTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		gt.refuse(t, 0)
		overHold := gateRequest{class: testClass, held: true, holdEnd: time.Now()}
		resp, _, err := gt.gate.ask(t.Context(), overHold, gt.call)
		if err != nil || resp.GetNoAccount() == nil || gt.calls.Load() != 1 {
			t.Errorf("a held request got %v, %v after %d calls; want the shared refusal without a call", resp, err, gt.calls.Load())
		}
		if got := time.Until(resp.GetNoAccount().GetRetryAt().AsTime()); got != noneMin {
			t.Errorf("a retry time already passed is shared for %v, want noneMin (%v)", got, noneMin)
		}
		time.Sleep(noneMin)
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return refusal(2 * time.Second), nil })
		if _, _, err := gt.gate.ask(t.Context(), gateRequest{class: testClass, held: true, holdEnd: time.Now()}, gt.call); err != nil || gt.calls.Load() != 2 {
			t.Errorf("past its retry time: %v after %d calls, want a new call", err, gt.calls.Load())
		}

		// Not held: one asks, the others wait for its answer.
		release := make(chan struct{})
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) {
			<-release
			return refusal(time.Second), nil
		})
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				resp, _, err := gt.gate.ask(t.Context(), gateRequest{class: testClass}, gt.call)
				if err != nil || resp.GetNoAccount() == nil {
					t.Errorf("not held: %v, %v; want the refusal", resp, err)
				}
			})
		}
		synctest.Wait()
		close(release)
		wg.Wait()
		if n := gt.calls.Load(); n != 3 {
			t.Errorf("%d calls, want 3 (the five not held share one)", n)
		}
		if n := gt.count("shared_none"); n != 5 {
			t.Errorf("%d shared refusals counted, want 5", n)
		}
	})
}

// TestGateInvalidationEndsTheShare: after an invalidation a refusal
// shared before it no longer answers, and a parked class's leader asks at
// once instead of sleeping out the shared answer.
func TestGateInvalidationEndsTheShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		gt.refuse(t, 5*time.Second)
		gt.gate.invalidate()
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return refusal(5 * time.Second), nil })
		if _, _, err := gt.gate.ask(t.Context(), gateRequest{class: testClass, held: true, holdEnd: time.Now()}, gt.call); err != nil || gt.calls.Load() != 2 {
			t.Errorf("after an invalidation: %v after %d calls, want a call", err, gt.calls.Load())
		}

		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return granted("l"), nil })
		done := make(chan time.Duration)
		go func() {
			_, parked, err := gt.gate.ask(t.Context(), gateRequest{class: testClass, held: true, holdEnd: time.Now().Add(time.Minute)}, gt.call)
			if err != nil {
				t.Errorf("parked ask: %v", err)
			}
			done <- parked
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		gt.gate.invalidate()
		if parked := <-done; parked != time.Second {
			t.Errorf("the leader asked after %v parked, want at the invalidation (1s)", parked)
		}
		if n := gt.calls.Load(); n != 3 {
			t.Errorf("%d calls, want 3", n)
		}
	})
}

// TestGateWaiterCancelled: a parked request whose client leaves returns
// at once with its context's error; when it led, the lead passes on and
// the next one asks for the rest.
func TestGateWaiterCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		gt.refuse(t, time.Second)
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) { return granted("l"), nil })
		held := gateRequest{class: testClass, held: true, holdEnd: time.Now().Add(time.Minute)}
		leaderCtx, leave := context.WithCancel(t.Context())
		left := make(chan error)
		go func() {
			_, _, err := gt.gate.ask(leaderCtx, held, gt.call)
			left <- err
		}()
		synctest.Wait() // the first parked leads
		stayed := make(chan *weirv1.AcquireResponse)
		go func() {
			resp, _, err := gt.gate.ask(t.Context(), held, gt.call)
			if err != nil {
				t.Errorf("the follower: %v", err)
			}
			stayed <- resp
		}()
		synctest.Wait()
		leave()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Errorf("the leader that left got %v, want context.Canceled", err)
		}
		start := time.Now()
		if resp := <-stayed; resp.GetLease() == nil {
			t.Errorf("the follower got %v, want the lease it asked for as the next leader", resp)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Errorf("the new leader asked after %v, want when the shared answer ran out", waited)
		}
		if n := gt.calls.Load(); n != 2 {
			t.Errorf("%d calls, want 2", n)
		}
		gt.gate.mu.Lock()
		defer gt.gate.mu.Unlock()
		if n := len(gt.gate.classes); n != 0 {
			t.Errorf("%d classes left at the gate once nobody waits and nothing is refused", n)
		}
	})
}

// TestGateLimit: with maxAsking Acquires of a class in flight the next
// request waits, FIFO, until one ends or a lease of the class comes back;
// one that comes back as it starts to wait is not missed, and one that
// leaves the queue is forgotten.
func TestGateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		release := make(chan struct{})
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) {
			<-release
			return granted("l"), nil
		})
		limited := gateRequest{class: testClass, limit: true}
		var wg sync.WaitGroup
		for range maxAsking {
			wg.Go(func() {
				if resp, _, err := gt.gate.ask(t.Context(), limited, gt.call); err != nil || resp.GetLease() == nil {
					t.Errorf("ask within the limit: %v, %v", resp, err)
				}
			})
		}
		synctest.Wait()
		if n := gt.calls.Load(); n != maxAsking {
			t.Fatalf("%d calls in flight, want %d", n, maxAsking)
		}

		back := limited
		back.cameBack = func() bool { return true }
		if resp, _, err := gt.gate.ask(t.Context(), back, gt.call); resp != nil || err != nil || gt.count("queued") != 0 {
			t.Errorf("a lease had come back: %v, %v, queued %d; want to look again at once", resp, err, gt.count("queued"))
		}

		ctx, leave := context.WithCancel(t.Context())
		left := make(chan error, 1)
		wg.Go(func() {
			_, _, err := gt.gate.ask(ctx, limited, gt.call)
			left <- err
		})
		var woken atomic.Int32
		for range 2 {
			wg.Go(func() {
				if resp, _, err := gt.gate.ask(t.Context(), limited, gt.call); resp != nil || err != nil {
					t.Errorf("queued: %v, %v; want to look again", resp, err)
				}
				woken.Add(1)
			})
		}
		synctest.Wait()
		if n := gt.count("queued"); n != 3 {
			t.Errorf("%d queued, want 3", n)
		}
		leave()
		synctest.Wait()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Errorf("the request that left the queue got %v", err)
		}
		gt.gate.leaseBack(testClass)
		synctest.Wait()
		if n := woken.Load(); n != 1 {
			t.Errorf("a lease coming back woke %d, want 1", n)
		}
		close(release) // the Acquires end: each frees a slot
		wg.Wait()
		if n := woken.Load(); n != 2 {
			t.Errorf("%d woken, want 2", n)
		}
		if n := gt.calls.Load(); n != maxAsking {
			t.Errorf("%d calls, want %d: a queued request looks again, it does not ask", n, maxAsking)
		}
	})
}

// TestGateRetry: a retry asks with what it tried unless the class's
// refusal stands, and shares an open breaker's refusal.
func TestGateRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gt := newGateTest()
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) {
			resp := refusal(time.Second)
			resp.GetNoAccount().Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN
			return resp, nil
		})
		for range 3 {
			if resp, err := gt.gate.retry(t.Context(), testClass, gt.call); err != nil || resp.GetNoAccount() == nil {
				t.Fatalf("retry: %v, %v", resp, err)
			}
		}
		if n := gt.calls.Load(); n != 1 || gt.whys[0] != askRetry {
			t.Errorf("%d calls (%v), want one retry: the open breaker's refusal is shared", n, gt.whys)
		}
		time.Sleep(time.Second)
		gt.answerWith(func(string) (*weirv1.AcquireResponse, error) {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("down"))
		})
		if _, err := gt.gate.retry(t.Context(), testClass, gt.call); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("retry past the retry time: %v, want the call's error", err)
		}
	})
}
