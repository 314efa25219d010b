package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
)

// The usage view: what each OAuth account's windows have left, from two
// sources. The usage endpoint is polled within a read budget that
// ClaimUsageRead (sql/queries/usage.sql) enforces for every replica,
// poller and operator at once; the unified rate-limit headers of every
// released response are merged in between polls.

// Usage window names (package upstream reads them), in the one order
// they are written (a fixed order keeps concurrent writers from
// deadlocking on each other's rows).
const (
	windowFiveHour = upstream.FiveHour
	windowSevenDay = upstream.SevenDay
)

var usageWindows = upstream.Windows

// Reading sources.
const (
	sourcePoll   = "poll"
	sourceHeader = "header"
)

const (
	// oauthBeta is the anthropic-beta value the OAuth endpoints require
	// (the reset claim's too).
	oauthBeta = upstream.AnthropicOAuthBeta

	// Poll cadence: busy accounts (used in the last usageBusyFor) about
	// every usageBusyEvery, idle ones about every usageIdleEvery, each
	// spread by ±usageJitter. The 150 s read budget applies on top.
	usageBusyFor   = 10 * time.Minute
	usageBusyEvery = 90 * time.Second
	usageIdleEvery = 10 * time.Minute
	usageJitter    = 0.15
	// usageBootSpread spreads the first reads of unscheduled accounts.
	usageBootSpread = 90 * time.Second
	// usageReadsPerRun and usageReadParallelism bound one poller run so it
	// ends well within River's job timeout.
	usageReadsPerRun     = 16
	usageReadParallelism = 4

	// Backoff after failed reads without a retry-after: 1 min doubling to
	// 30 min. A retry-after is honoured up to the same ceiling.
	usageBackoffBase = time.Minute
	usageBackoffMax  = 30 * time.Minute
)

// errNoUsageEndpoint: only OAuth accounts have a usage endpoint.
var errNoUsageEndpoint = invalidf("id: only OAuth accounts have a usage endpoint")

// usageReading is one window as read or merged.
type usageReading struct {
	window string
	// utilization is a fraction 0..1; nil means no evidence, never 0.
	utilization *float64
	resetsAt    *time.Time
}

// usageResult is what one attempt to read an account's usage came to.
type usageResult struct {
	// read: the budget allowed a read and it was sent upstream.
	read bool
	// landed: the readings were stored (false when the epoch or the
	// credential moved on while the read ran).
	landed bool
	// failure is why the read failed (no secret in it), when it did.
	failure error
	// nextAllowed is when the budget allows the next read.
	nextAllowed time.Time
}

// readUsage is the one way to read an account's usage endpoint. It claims
// the read from the budget first (no two reads of one account within 150 s,
// none while the endpoint asked us to wait), then reads and stores the
// readings under the epoch it claimed. The error is for what the caller
// must hear (not found, not OAuth, the database); an upstream failure is
// recorded, backed off and returned in the result.
func (j *AccountJobs) readUsage(ctx context.Context, id uuid.UUID) (usageResult, error) {
	acct, err := j.q.GetAccount(ctx, id)
	if err != nil {
		return usageResult{}, storeErr(err)
	}
	if acct.AuthKind != "oauth" || (acct.Provider != providerAnthropic && acct.Provider != providerCodex) {
		return usageResult{}, errNoUsageEndpoint
	}
	now := j.now()
	claim, err := j.q.ClaimUsageRead(ctx, db.ClaimUsageReadParams{AccountID: id, CredentialRevision: acct.CredentialRevision, Now: now})
	if errors.Is(err, pgx.ErrNoRows) {
		at, err := j.q.UsageReadAllowedAt(ctx, db.UsageReadAllowedAtParams{AccountID: id, Now: now})
		if err != nil {
			return usageResult{}, storeErr(err)
		}
		return usageResult{nextAllowed: at}, nil
	}
	if err != nil {
		return usageResult{}, err
	}

	res := usageResult{read: true}
	readings, grants, wait, ferr := j.fetchUsage(ctx, acct)
	now = j.now()
	if ferr != nil {
		if errors.Is(ferr, context.Canceled) {
			// Our shutdown, not the endpoint's answer: the claim stands (the
			// request may have reached it) but nothing backs off.
			return usageResult{}, ferr
		}
		blocked := now.Add(usageBackoff(claim.Failures+1, wait))
		if err := j.q.RecordUsageFailure(ctx, db.RecordUsageFailureParams{
			AccountID: id, LastError: ferr.Error(), BlockedUntil: blocked,
		}); err != nil {
			return usageResult{}, err
		}
		j.log.WarnContext(ctx, "usage read failed", "account_id", id, "failures", claim.Failures+1, "blocked_until", blocked, "err", ferr)
		res.failure = ferr
		res.nextAllowed, err = j.q.UsageReadAllowedAt(ctx, db.UsageReadAllowedAtParams{AccountID: id, Now: now})
		return res, storeErr(err)
	}
	next := usageCadence(acct.LastUsedAt, now, j.jitter())
	err = j.tx(ctx, func(q *db.Queries) error {
		present := make(map[string]usageReading, len(readings))
		for _, r := range readings {
			present[r.window] = r
		}
		for _, w := range usageWindows {
			r, ok := present[w]
			if !ok {
				if err := q.DeleteUsageWindow(ctx, db.DeleteUsageWindowParams{AccountID: id, WindowName: w}); err != nil {
					return err
				}
				continue
			}
			if _, err := q.UpsertUsageWindow(ctx, db.UpsertUsageWindowParams{
				AccountID: id, WindowName: w, Utilization: r.utilization, ResetsAt: r.resetsAt,
				Source: sourcePoll, Now: now, CredentialRevision: acct.CredentialRevision,
				Epoch: pgtype.Int8{Int64: claim.Epoch, Valid: true},
			}); err != nil {
				return err
			}
		}
		// Last, and under the row lock: if the epoch or the credential
		// moved on since the claim, nothing of this read lands.
		n, err := q.RecordUsageSuccess(ctx, db.RecordUsageSuccessParams{
			AccountID: id, Epoch: claim.Epoch, CredentialRevision: acct.CredentialRevision, Now: now, NextReadAt: next,
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return errStaleUsage
		}
		if grants != nil {
			if err := storeResetGrants(ctx, q, id, *grants, now); err != nil {
				return err
			}
		}
		return j.recoverQuota(ctx, q, id, readings, now)
	})
	switch {
	case errors.Is(err, errStaleUsage):
		j.log.InfoContext(ctx, "usage reading dropped: epoch moved on", "account_id", id, "epoch", claim.Epoch)
	case err != nil:
		return usageResult{}, fmt.Errorf("store usage: %w", err)
	default:
		res.landed = true
	}
	at, err := j.q.UsageReadAllowedAt(ctx, db.UsageReadAllowedAtParams{AccountID: id, Now: now})
	if err != nil {
		return usageResult{}, storeErr(err)
	}
	res.nextAllowed = at
	return res, nil
}

var errStaleUsage = errors.New("usage reading is stale")

// ReadDue reads every OAuth account whose next read is due, a few at a
// time, within the read budget, and says how many it read. Accounts never
// scheduled (at boot, new accounts, new credentials) are first given a
// read spread over the next 90 s. It is the poller's half of
// jobs.UsageReader.
func (j *AccountJobs) ReadDue(ctx context.Context) (int, error) {
	now := j.now()
	if _, err := j.q.StaggerUnscheduledUsagePolls(ctx, db.StaggerUnscheduledUsagePollsParams{
		Now: now, SpreadSeconds: usageBootSpread.Seconds(),
	}); err != nil {
		return 0, fmt.Errorf("schedule usage reads: %w", err)
	}
	due, err := j.q.DueUsagePolls(ctx, db.DueUsagePollsParams{Now: now, MaxReads: usageReadsPerRun})
	if err != nil {
		return 0, fmt.Errorf("due usage reads: %w", err)
	}
	return forEachBounded(due, usageReadParallelism, func(id uuid.UUID) (bool, error) {
		res, err := j.readUsage(ctx, id)
		if err == nil && !res.read {
			// Someone else read it (another replica, an operator).
			err = j.q.DeferUsagePoll(ctx, id)
		}
		if err != nil {
			return res.read, fmt.Errorf("read usage of %s: %w", id, err)
		}
		return res.read, nil
	})
}

// rearmUsage starts a new poll epoch for an account and schedules its next
// read at (within the budget): for a quota cooldown that wants to know when
// its window recovers. Reads claimed before never land.
func rearmUsage(ctx context.Context, q *db.Queries, id uuid.UUID, at time.Time) (int64, error) {
	epoch, err := q.RearmUsagePoll(ctx, db.RearmUsagePollParams{AccountID: id, NextReadAt: at})
	return epoch, storeErr(err)
}

// answeredUsage is one released answer's usage headers: the account that
// answered and the credential revision its lease carried.
type answeredUsage struct {
	account  uuid.UUID
	revision int64
	headers  map[string]string
}

// mergeUsageHeaders folds the unified rate-limit headers of released
// answers into the usage view, under each lease's credential revision and
// the current epoch, in one statement: a batch's readings of one window
// are folded into one first (foldReadings), so a batch of successes on a
// subscription writes each of its windows once, not twice per success.
// Release and ReleaseBatch call it inside their transaction.
func (j *AccountJobs) mergeUsageHeaders(ctx context.Context, q *db.Queries, answers []answeredUsage, now time.Time) error {
	rs := foldReadings(answers, now)
	if len(rs) == 0 {
		return nil
	}
	p := db.UpsertUsageWindowsParams{Source: sourceHeader, Now: now}
	for _, r := range rs {
		p.AccountIds = append(p.AccountIds, r.account)
		p.CredentialRevisions = append(p.CredentialRevisions, r.revision)
		p.WindowNames = append(p.WindowNames, r.window)
		p.HasUtilization = append(p.HasUtilization, r.utilization != nil)
		p.Utilizations = append(p.Utilizations, valueOr(r.utilization))
		p.HasResetsAt = append(p.HasResetsAt, r.resetsAt != nil)
		p.ResetsAts = append(p.ResetsAts, valueOr(r.resetsAt))
	}
	if _, err := q.UpsertUsageWindows(ctx, p); err != nil {
		return fmt.Errorf("merge usage headers: %w", err)
	}
	return nil
}

// valueOr is *p, or T's zero value when p is nil.
func valueOr[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// accountReading is one window's reading of one account under one
// credential revision.
type accountReading struct {
	account  uuid.UUID
	revision int64
	usageReading
}

// foldReadings is the readings the answers' headers carry, one per
// account, credential revision and window: of a batch's readings of one
// window, in the order the answers came, a reading replaces the one kept
// by the rule the store applies to a reading of the same revision and
// epoch (supersedes), so what is stored is what storing them one by one
// would leave whenever the window's reset only moves forward. Sorted by
// account and window, the order the store locks their rows in. Pure.
func foldReadings(answers []answeredUsage, now time.Time) []accountReading {
	type key struct {
		account  uuid.UUID
		revision int64
		window   string
	}
	var out []accountReading
	var at map[key]int
	for _, a := range answers {
		for _, r := range readingsOf(upstream.HeaderReadings(a.headers, now)) {
			k := key{a.account, a.revision, r.window}
			if at == nil {
				at = map[key]int{}
			}
			i, ok := at[k]
			switch {
			case !ok:
				at[k] = len(out)
				out = append(out, accountReading{account: a.account, revision: a.revision, usageReading: r})
			case supersedes(out[i].usageReading, r):
				out[i].usageReading = r
			}
		}
	}
	slices.SortFunc(out, func(x, y accountReading) int {
		if c := slices.Compare(x.account[:], y.account[:]); c != 0 {
			return c
		}
		if c := strings.Compare(x.window, y.window); c != 0 {
			return c
		}
		return cmp.Compare(x.revision, y.revision)
	})
	return out
}

// supersedes says whether reading x replaces w, a reading of the same
// window under the same revision and epoch: the store's rule
// (sql/functions/weir_usage_supersedes.sql). A reading without a reset or a utilization is
// replaced, as is one whose reset is more than 2 s away (another window);
// within the same window the higher utilization stays.
func supersedes(w, x usageReading) bool {
	switch {
	case w.resetsAt == nil || x.resetsAt == nil || w.utilization == nil:
		return true
	case x.resetsAt.Sub(*w.resetsAt).Abs().Seconds() > 2:
		return true
	}
	return x.utilization != nil && *x.utilization > *w.utilization
}

// fetchUsage reads the account's usage endpoint (package upstream). Only
// readUsage may call it, after claiming the read (a test holds every
// other caller out). It returns the readings (and, for an account with
// banked resets enabled, the reset grants: nil when not asked for or not
// answered), or an error without the credential in it and how long the
// endpoint asked us to wait (0: it did not say).
func (j *AccountJobs) fetchUsage(ctx context.Context, acct db.Account) ([]usageReading, *[]resetGrant, time.Duration, error) {
	token, err := j.seal.Open(acct.ID, acct.CredentialRevision, acct.CredentialSealed)
	if err != nil {
		return nil, nil, 0, errCredentialUnreadable
	}
	client, release, err := j.clientFor(ctx, j.egress.usage, j.cfg.UsageClient, acct)
	if err != nil {
		return nil, nil, 0, err
	}
	defer release()
	base := accountBaseURL(acct.Provider, acct.BaseUrl)
	if acct.Provider == providerCodex {
		readings, wait, err := upstream.ReadCodexUsage(ctx, client, base, token, acct.UpstreamAccountID, j.now)
		return readingsOf(readings), nil, wait, err
	}
	u, wait, err := upstream.ReadAnthropicUsage(ctx, client, base, token, acct.BankedResetsEnabled)
	if err != nil {
		return nil, nil, wait, err
	}
	var grants *[]resetGrant
	if acct.BankedResetsEnabled {
		grants = parseResetGrants(u.Body)
	}
	return readingsOf(u.Readings), grants, 0, nil
}

// readingsOf is provider readings as the control plane keeps them.
func readingsOf(rs []upstream.Reading) []usageReading {
	var out []usageReading
	for _, r := range rs {
		out = append(out, usageReading{window: r.Window, utilization: r.Utilization, resetsAt: r.ResetsAt})
	}
	return out
}

// scrubbed is upstream.Scrub as a value, for the control plane's own
// upstream calls and logs.
type scrubbed struct {
	err    error
	secret string
}

func (e scrubbed) Error() string { return upstream.Scrub(e.err, e.secret).Error() }

func (e scrubbed) Unwrap() error { return e.err }

// usageCadence is when the poller reads an account next: about 90 s from
// now while it is busy (used within the last 10 minutes), about 10 minutes
// when idle, spread by ±15% with jitter in [-1, 1]. The 150 s read budget
// still applies on top, so a busy account is in effect read every 150 s.
func usageCadence(lastUsed *time.Time, now time.Time, jitter float64) time.Time {
	every := usageIdleEvery
	if lastUsed != nil && now.Sub(*lastUsed) < usageBusyFor {
		every = usageBusyEvery
	}
	jitter = max(-1, min(1, jitter))
	return now.Add(time.Duration(float64(every) * (1 + usageJitter*jitter)).Round(time.Millisecond))
}

// usageBackoff is how long to leave an account's usage endpoint alone after
// its failures-th failure in a row: the endpoint's retry-after when it sent
// one, else 1 min doubling; both at most 30 min.
func usageBackoff(failures int32, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, usageBackoffMax)
	}
	return backoff.Capped(usageBackoffBase, usageBackoffMax, int(failures)-1)
}

// defaultJitter is uniform in [-1, 1).
func defaultJitter() float64 { return rand.Float64()*2 - 1 }

// accountUsage is one account's usage view as operators see it.
type accountUsage struct {
	windows []*weirv1.UsageWindow
	readAt  *time.Time
}

// fill sets a's usage fields.
func (u accountUsage) fill(a *weirv1.Account) {
	a.Usage, a.UsageReadAt = u.windows, timestampOrNil(u.readAt)
}

// usageView reads every account's usage windows in one query.
func (st store) usageView(ctx context.Context) (map[uuid.UUID]accountUsage, error) {
	rows, err := st.q.UsageView(ctx, uuid.NullUUID{})
	if err != nil {
		return nil, fmt.Errorf("usage view: %w", err)
	}
	out := make(map[uuid.UUID]accountUsage)
	for _, r := range rows {
		u := out[r.AccountID]
		u.readAt = r.LastOkAt
		if r.WindowName != nil {
			w := &weirv1.UsageWindow{
				Window:      *r.WindowName,
				Utilization: r.Utilization,
				ResetsAt:    timestampOrNil(r.ResetsAt),
				ObservedAt:  timestampOrNil(r.ObservedAt),
			}
			if r.Source != nil {
				w.Source = *r.Source
			}
			u.windows = append(u.windows, w)
		}
		out[r.AccountID] = u
	}
	return out, nil
}

// RefreshUsage reads an account's usage endpoint now, through the same
// budget as the poller.
func (a accountService) RefreshUsage(ctx context.Context, req *connect.Request[weirv1.RefreshUsageRequest]) (*connect.Response[weirv1.RefreshUsageResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	res, err := a.readUsage(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	if row, err = a.q.GetAccount(ctx, row.ID); err != nil {
		return nil, storeErr(err)
	}
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	out := &weirv1.RefreshUsageResponse{Read: res.read, NextReadAllowedAt: timestamppb.New(res.nextAllowed), Account: acct}
	if res.failure != nil {
		out.Error = res.failure.Error()
	}
	return connect.NewResponse(out), nil
}
