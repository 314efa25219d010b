// Package notify raises notifications for operators and renders them:
// the events and their fan-out to targets (Event, Notifier.Enqueue), what
// a target receives (WebhookBody, SlackBody, Sign), one delivery's POST
// (Send), and the watch's pure transitions (Evaluate). The control plane
// reads and writes the rest (controlplane/notify.go: NotifyService, the
// delivery and the watch), and jobs/notify.go runs them as River jobs.
// docs/notifications.md is the operators' account.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/weirhq/weir/controlplane/db"
)

// The event kinds: stable names, which targets subscribe to and receivers
// switch on. docs/notifications.md says what raises each.
const (
	// AccountBroken: an account's credential was rejected (or opens with
	// no control plane's key) and it is out of routing until mended.
	AccountBroken = "account_broken"
	// AccountRecovered: an account reported broken is no longer (an
	// operator's resume, a new credential, a refresh).
	AccountRecovered = "account_recovered"
	// PoolExhausted, PoolLow, PoolRestored: the accounts of a provider (or
	// of a provider for one model family) that can serve now dropped to
	// none, or to the pool_low_accounts setting or fewer; or came back
	// from there (its level field says to what: "low" or "ok").
	PoolExhausted = "pool_exhausted"
	PoolLow       = "pool_low"
	PoolRestored  = "pool_restored"
	// BreakerOpenLong: a provider's overload breaker for a family has
	// been open longer than the breaker_notify_after setting;
	// BreakerClosed: it closed after that was notified.
	BreakerOpenLong = "breaker_open_long"
	BreakerClosed   = "breaker_closed"
	// BudgetThreshold: spending crossed a budget's threshold.
	BudgetThreshold = "budget_threshold"
	// SessionCap: a session reached its cap.
	SessionCap = "session_cap"
	// Test is what `weir notify test` sends: to the one target named,
	// whatever it subscribes to.
	Test = "test"
)

// Kinds are the kinds a target may subscribe to, in a stable order.
func Kinds() []string {
	return []string{AccountBroken, AccountRecovered, PoolExhausted, PoolLow, PoolRestored,
		BreakerOpenLong, BreakerClosed, BudgetThreshold, SessionCap}
}

// Severity grades an event.
type Severity string

const (
	Info     Severity = "info"
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// DefaultDedupWindow is how long an event's kind and dedup key hold off
// another event with the same two, unless Event.DedupWindow says
// otherwise.
const DefaultDedupWindow = 24 * time.Hour

// MaxDedupWindow bounds Event.DedupWindow: deduplication reads the stored
// events, which the retention job keeps Retention.
const MaxDedupWindow = Retention

// Retention is how long events and their deliveries are kept (the
// retention job, jobs/retention.go, deletes older ones); a delivery still
// pending stays until it ends.
const Retention = 30 * 24 * time.Hour

// Event is one thing to tell operators.
type Event struct {
	// Kind is one of Kinds() (or Test).
	Kind string
	// DedupKey names the occurrence: Enqueue drops an event whose kind and
	// key it saw within DedupWindow. Make it name what happened and when
	// it began ("<account id>@<broken_at>", "<key id>:80%:<period start>"),
	// so a retry of the same write is dropped and the next occurrence is
	// not. At most 200 bytes.
	DedupKey string
	Severity Severity
	// Text is one line for a person, at most 300 bytes.
	Text string
	// Fields are the event's facts for machines: names and ids (an
	// account's label and id, a provider, a family), counts, times. Never
	// a credential, a token, a URL or anything secret: they go to every
	// subscribed target as they are. Values must marshal to JSON.
	Fields map[string]any
	// DedupWindow overrides DefaultDedupWindow (at most MaxDedupWindow).
	DedupWindow time.Duration
}

// check refuses an event Enqueue cannot store as documented.
func (ev Event) check() error {
	switch {
	case ev.Kind != Test && !slices.Contains(Kinds(), ev.Kind):
		return fmt.Errorf("notify: unknown event kind %q (add it to Kinds)", ev.Kind)
	case ev.DedupKey == "" || len(ev.DedupKey) > 200:
		return errors.New("notify: " + ev.Kind + ": the dedup key must be 1 to 200 bytes")
	case ev.Severity != Info && ev.Severity != Warning && ev.Severity != Critical:
		return fmt.Errorf("notify: %s: unknown severity %q", ev.Kind, ev.Severity)
	case ev.Text == "" || len(ev.Text) > 300 || strings.ContainsAny(ev.Text, "\r\n"):
		return errors.New("notify: " + ev.Kind + ": the text must be one line of 1 to 300 bytes")
	case ev.DedupWindow < 0 || ev.DedupWindow > MaxDedupWindow:
		return fmt.Errorf("notify: %s: dedup window %v out of range [0, %v]", ev.Kind, ev.DedupWindow, MaxDedupWindow)
	}
	return nil
}

// DeliveryArgs is one delivery's River job (jobs/notify.go works it): one
// event to one target.
type DeliveryArgs struct {
	DeliveryID int64 `json:"delivery_id"`
}

// Kind names the job in River's tables and UI.
func (DeliveryArgs) Kind() string { return "notify_delivery" }

// MaxAttempts is how many times a delivery is tried: with RetryDelay's
// waits, over about an hour (30 s, 1, 2, 4, 8, 16 and 30 minutes between
// the eight), long enough to outlast a receiver's deploy or brief outage,
// short enough that a notification is not news by the time it lands.
const MaxAttempts = 8

// InsertOpts: at most MaxAttempts, and one job per delivery.
func (DeliveryArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: MaxAttempts, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// Enqueued is what Enqueue did.
type Enqueued struct {
	// EventID is the stored event; 0 when Duplicate.
	EventID int64
	// Duplicate: the kind and dedup key were seen within the window, so
	// nothing was written.
	Duplicate bool
	// Deliveries are the deliveries made, one per subscribed target
	// (none when no target wants the kind).
	Deliveries []int64
}

// Notifier enqueues events. It inserts River jobs without working them: a
// control plane running River works them, whichever replica enqueued.
type Notifier struct {
	river *river.Client[pgx.Tx]
	now   func() time.Time
}

// NewNotifier enqueues into pool's River tables; now dates the events.
func NewNotifier(pool *pgxpool.Pool, now func() time.Time) (*Notifier, error) {
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, fmt.Errorf("notify: river: %w", err)
	}
	return &Notifier{river: c, now: now}, nil
}

// Enqueue raises ev inside the caller's transaction tx: it stores the
// event and, for each target subscribed to ev.Kind (targets naming it, and
// those naming no kind), one pending delivery and its River job. All of it
// commits or rolls back with tx, so an event is raised exactly when the
// change it reports is made; nothing is sent before tx commits.
//
// Deduplication: an event whose Kind and DedupKey were enqueued (and
// committed) within its dedup window (Event.DedupWindow, else
// DefaultDedupWindow) before is dropped: Enqueue writes nothing and
// returns Duplicate. Concurrent Enqueues of the same kind and key wait for
// each other (an advisory lock held until tx ends), so two transactions
// racing to raise one event raise it once. Each delivery is also unique
// per (event, target), and its job per delivery.
//
// ev must pass its documented bounds (a known Kind, a DedupKey, a
// Severity, one line of Text) or Enqueue returns an error and writes
// nothing; the caller decides whether that fails its transaction. Its
// Text and Fields are sent to every subscribed target as they are: never
// put a credential or secret in them. Delivery is at least once: a
// receiver deduplicates on the payload's id.
func (n *Notifier) Enqueue(ctx context.Context, tx pgx.Tx, ev Event) (Enqueued, error) {
	return n.enqueue(ctx, tx, ev, nil)
}

// EnqueueTest raises a Test event for one target, whatever it subscribes
// to; each call is a new event.
func (n *Notifier) EnqueueTest(ctx context.Context, tx pgx.Tx, target uuid.UUID, targetName string) (Enqueued, error) {
	return n.enqueue(ctx, tx, Event{
		Kind: Test, DedupKey: target.String() + "/" + uuid.NewString(),
		Severity: Info, Text: "test notification from weir to " + targetName,
		Fields: map[string]any{"target": targetName},
	}, &target)
}

func (n *Notifier) enqueue(ctx context.Context, tx pgx.Tx, ev Event, only *uuid.UUID) (Enqueued, error) {
	if err := ev.check(); err != nil {
		return Enqueued{}, err
	}
	fields := ev.Fields
	if fields == nil {
		fields = map[string]any{}
	}
	raw, err := json.Marshal(fields)
	if err != nil {
		return Enqueued{}, fmt.Errorf("notify: %s: fields: %w", ev.Kind, err)
	}
	window := ev.DedupWindow
	if window == 0 {
		window = DefaultDedupWindow
	}
	q := db.New(tx)
	now := n.now()
	if err := q.LockNotifyKey(ctx, ev.Kind+":"+ev.DedupKey); err != nil {
		return Enqueued{}, fmt.Errorf("notify: lock: %w", err)
	}
	seen, err := q.RecentNotifyEvent(ctx, db.RecentNotifyEventParams{Kind: ev.Kind, DedupKey: ev.DedupKey, Since: now.Add(-window)})
	if err != nil {
		return Enqueued{}, fmt.Errorf("notify: dedup: %w", err)
	}
	if seen {
		return Enqueued{Duplicate: true}, nil
	}
	id, err := q.InsertNotifyEvent(ctx, db.InsertNotifyEventParams{
		Kind: ev.Kind, DedupKey: ev.DedupKey, Severity: string(ev.Severity), Text: ev.Text, Fields: raw, Now: now,
	})
	if err != nil {
		return Enqueued{}, fmt.Errorf("notify: store event: %w", err)
	}
	out := Enqueued{EventID: id}
	var targets []uuid.UUID
	if only != nil {
		targets = []uuid.UUID{*only}
	} else if targets, err = q.SubscribedNotifyTargets(ctx, ev.Kind); err != nil {
		return Enqueued{}, fmt.Errorf("notify: targets: %w", err)
	}
	if len(targets) == 0 {
		return out, nil
	}
	if out.Deliveries, err = q.InsertNotifyDeliveries(ctx, db.InsertNotifyDeliveriesParams{
		EventID: id, TargetIds: targets, Now: now,
	}); err != nil {
		return Enqueued{}, fmt.Errorf("notify: store deliveries: %w", err)
	}
	jobs := make([]river.InsertManyParams, len(out.Deliveries))
	for i, d := range out.Deliveries {
		jobs[i] = river.InsertManyParams{Args: DeliveryArgs{DeliveryID: d}}
	}
	if _, err := n.river.InsertManyTx(ctx, tx, jobs); err != nil {
		return Enqueued{}, fmt.Errorf("notify: enqueue deliveries: %w", err)
	}
	return out, nil
}
