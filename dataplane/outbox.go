package dataplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/internal/backoff"
)

// outbox sends what the worker reports to the control plane off the
// request path, in batches: whatever is queued when a call can go, up to
// batch items, in one call. A call starts at most once per pace (unless
// the last one was full): under load a batch fills meanwhile; after a
// quiet spell an item goes alone and at once. What is only due (a
// nudge: a request in progress, whose pending event due adds) goes with
// the next batch, within a pace, not at once.
//
// A batch the control plane did not take (undelivered: it was
// unreachable, or its database down) stays queued, first, and is sent
// again, with what queued meanwhile, after a pause that doubles while the
// outage lasts. What is sent must be safe to send twice: the control
// plane stores each item once however often it arrives. The queue is
// bounded: past limit the oldest items are dropped and counted, so a
// worker cut off for long keeps a bounded amount. On close what is queued
// gets one more try; what the control plane does not take then is lost,
// and logged.
type outbox[T any] struct {
	// what names the items in logs ("route events").
	what string
	log  *slog.Logger
	// send makes one call with batch; an error for which undelivered is
	// true keeps the batch queued. It may keep batch only for the call.
	send func(ctx context.Context, batch []T) error
	// due, if set, adds to a batch, up to n, what is due when it goes
	// (pending route events); nudge, if set, wakes the loop for it.
	due   func(n int) []T
	nudge <-chan struct{}
	// dropped counts the items dropped past limit; redelivered, if set, a
	// call taken after failed ones.
	dropped     func(n int)
	redelivered func()
	batch       int
	limit       int
	pace        time.Duration

	mu sync.Mutex
	// queue holds what is to send, oldest first; head is the sequence
	// number of queue[0], so that a batch in flight is taken off the queue
	// once taken, and only what of it is still there (the bound may have
	// dropped part of it meanwhile).
	queue []T
	head  uint64
	kick  chan struct{}
	// life ends when close is called.
	life context.Context
	stop context.CancelFunc
	done chan struct{}
	// urgent: something queued must not wait for the pace (a budgeted
	// key's spend, which other workers' Acquires count; a lease given
	// back, whose slot another worker may be waiting for). hurry cuts a
	// pace already being waited out short.
	urgent atomic.Bool
	hurry  chan struct{}
}

// outboxSendTimeout bounds one call.
const outboxSendTimeout = 5 * time.Second

// start starts the loop; o's fields are set.
func (o *outbox[T]) start() *outbox[T] {
	o.kick = make(chan struct{}, 1)
	o.hurry = make(chan struct{}, 1)
	o.life, o.stop = context.WithCancel(context.Background())
	o.done = make(chan struct{})
	go o.run()
	return o
}

// put queues items and wakes the loop.
func (o *outbox[T]) put(items ...T) {
	o.mu.Lock()
	o.queue = append(o.queue, items...)
	if n := len(o.queue) - o.limit; n > 0 {
		o.queue = slices.Delete(o.queue, 0, n)
		o.head += uint64(n)
		o.dropped(n)
	}
	o.mu.Unlock()
	o.wake()
}

// putNow is put for items that must go without waiting for the pace.
func (o *outbox[T]) putNow(items ...T) {
	o.urgent.Store(true)
	o.put(items...)
	select {
	case o.hurry <- struct{}{}:
	default:
	}
}

// paced waits until pace has passed since last, or until something
// urgent is queued; false when the outbox closes meanwhile.
func (o *outbox[T]) paced(last time.Time) bool {
	if o.urgent.Swap(false) {
		return true
	}
	d := time.Until(last.Add(o.pace))
	if d <= 0 {
		return o.life.Err() == nil
	}
	hurried, open := o.wait(d, nil)
	if hurried {
		o.urgent.Store(false)
	}
	return open
}

// awaitDue waits a pace after a nudge, or until something is put or
// urgent; false when the outbox closes meanwhile. What a nudge announces
// is due within a pace, not at once: a request that ends before then
// needs no pending event, and a quiet worker's short request is stored
// once, not twice. After a hurry urgent stays set: paced lets it go at
// once.
func (o *outbox[T]) awaitDue() bool {
	if o.pace <= 0 {
		return o.life.Err() == nil
	}
	_, open := o.wait(o.pace, o.kick)
	return open
}

// wait waits d, or until kick (nil: never) or hurry fires; hurried says
// it was hurry, open false that the outbox closed meanwhile.
func (o *outbox[T]) wait(d time.Duration, kick <-chan struct{}) (hurried, open bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-kick:
	case <-o.hurry:
		return true, true
	case <-o.life.Done():
		return false, false
	}
	return false, true
}

func (o *outbox[T]) wake() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// queued returns a copy of what is queued, oldest first.
func (o *outbox[T]) queued() []T {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.queue)
}

// take returns the next batch (a fresh slice: nothing the call is given
// is written to while it may be in flight) and its first item's sequence
// number. More than due: unless closing, what is due joins it.
func (o *outbox[T]) take(closing bool) ([]T, uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.due != nil && !closing && len(o.queue) < o.batch {
		o.queue = append(o.queue, o.due(o.batch-len(o.queue))...)
	}
	return slices.Clone(o.queue[:min(len(o.queue), o.batch)]), o.head
}

// taken takes the n items from sequence number from off the queue, or
// what of them the bound left there; it reports whether more is queued.
func (o *outbox[T]) taken(from uint64, n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if end := from + uint64(n); end > o.head {
		k := min(int(end-o.head), len(o.queue))
		o.queue = slices.Delete(o.queue, 0, k)
		o.head += uint64(k)
	}
	return len(o.queue) > 0
}

func (o *outbox[T]) run() {
	defer close(o.done)
	var (
		last    time.Time
		full    bool
		wait    time.Duration // the pause before sending again; 0: not failing
		closing bool
	)
	for {
		if wait == 0 && !closing {
			select {
			case <-o.kick:
			case <-o.nudge:
				if !o.awaitDue() {
					closing = true
				}
			case <-o.life.Done():
				closing = true
			}
			if !full && !closing && !o.paced(last) {
				closing = true
			}
		}
		batch, from := o.take(closing)
		if len(batch) == 0 {
			if closing {
				return
			}
			continue
		}
		full = len(batch) == o.batch
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), outboxSendTimeout)
		err := o.send(ctx, batch)
		cancel()
		switch {
		case err == nil:
			if wait > 0 && o.redelivered != nil {
				o.redelivered()
			}
			wait = 0
		case undelivered(err) && closing:
			o.log.Warn("closing with reports the control plane did not take",
				"what", o.what, "items", len(o.queued()), "err", err)
			return
		case undelivered(err):
			wait = backoff.Next(wait, 100*time.Millisecond, 5*time.Second)
			o.log.Warn("reports not delivered; sending them again", "what", o.what, "items", len(batch), "in", wait, "err", err)
			if !sleepCtx(o.life, wait) {
				closing = true
			}
			continue // still queued
		default:
			o.log.Warn("reports refused", "what", o.what, "items", len(batch), "err", err)
			wait = 0
		}
		if o.taken(from, len(batch)) {
			o.wake() // more is queued: the next call goes within pace
		}
	}
}

// close sends what is queued, waiting until that is done or ctx ends.
func (o *outbox[T]) close(ctx context.Context) {
	o.stop()
	select {
	case <-o.done:
	case <-ctx.Done():
	}
}

// undelivered says whether a failed call may not have reached the control
// plane, or found it unable to store it (its database down), so that
// sending it again can succeed. A refusal (invalid, not found) is final.
func undelivered(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown,
		connect.CodeInternal, connect.CodeAborted, connect.CodeCanceled, connect.CodeResourceExhausted:
		return true
	}
	return false
}
