package dataplane

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/failpolicy"
	"github.com/weirhq/weir/internal/randid"
)

// inbound is one client request, read whole before the first attempt: the
// worker needs the bytes to replay them, and handing the inbound body to
// the upstream request risks golang/go#40747.
type inbound struct {
	sf        surface
	requestID string
	// unverified: the key could not be checked (the control plane was
	// unreachable); the request is recorded all the same.
	unverified bool
	keyHash    string
	keyID      string
	// allowedModels is the key's allowlist (nil: any model); a model
	// list is filtered by it.
	allowedModels []string
	body          []byte
	// hold is body's reservation in the worker's body buffer.
	hold    *bodyHold
	model   string
	stream  bool
	session string
	start   time.Time
	// outcome is set when the worker answers on its own (a usage limit, an
	// unreachable control plane, no account); else requestOutcome derives
	// it from the status and lastClass, the last attempt's class.
	outcome   string
	lastClass weirv1.OutcomeClass
	// spilledTo is the provider of the last attempt's account when its
	// lease was a spill to a metered account; "" otherwise.
	spilledTo string
	// routed: the request reached routing (it is recorded by a route
	// event); else it was refused, for refusal (refusals.go).
	routed  bool
	refusal string
	// budgeted: the key or its team has a budget (verifiedKey); team is
	// the key's team.
	budgeted bool
	team     string
	// history is the conversation of the Responses WebSocket the request
	// came on; nil over HTTP.
	history *wsHistory
	// xlated is the body's last translation (translation.go), let go
	// with the body.
	xlated *translatedBody
	// poolQuota is the pool out of quota, as the last answer that nothing
	// could serve found it; nil when it was not (the rate-limit headers
	// say "rejected" from it, poolHeaders).
	poolQuota *weirv1.QuotaBlock
}

// letGo drops the body once nothing will replay it, and gives its
// reservation back.
func (in *inbound) letGo() {
	in.body, in.xlated = nil, nil
	in.hold.release()
}

func newRequestID() string {
	return "weir_" + randid.Hex(12)
}

func (s *Server) proxyHandler(sf surface) http.HandlerFunc {
	surface := sf.name
	return func(w http.ResponseWriter, r *http.Request) {
		in := &inbound{sf: sf, requestID: newRequestID(), start: s.cfg.Now()}
		tw := &trackingWriter{ResponseWriter: w, now: s.cfg.Now}
		tw.beforeHeader = func(status int, h http.Header) { s.poolHeaders(in, status, h) }
		tw.Header().Set("Weir-Request-Id", in.requestID)
		s.cors(tw.Header(), r)
		rec := &weirv1.RouteEvent{RequestId: in.requestID, Surface: surface, StartedAt: timestamppb.New(in.start)}
		ctx, span := s.startRequestSpan(r, in)
		s.serve(tw, r.WithContext(ctx), in, rec)
		outcome := requestOutcome(in.outcome, tw.status, in.lastClass)
		endRequestSpan(span, in, rec, tw.status, outcome)
		rec.Status = int32(tw.status)
		rec.Duration = durationpb.New(s.cfg.Now().Sub(in.start))
		if !tw.firstByte.IsZero() {
			ttfb := tw.firstByte.Sub(in.start)
			rec.TimeToFirstByte = durationpb.New(ttfb)
			s.metrics.ttfb.WithLabelValues(surface).Observe(ttfb.Seconds())
		}
		s.metrics.requests.WithLabelValues(surface, outcome).Inc()
		// A spill is a request a metered account served: one whose metered
		// attempt failed (a 401, a cut stream) spent nothing worth counting.
		if rec.SpilledToMetered = in.spilledTo != "" && outcome == outcomeSuccess; rec.SpilledToMetered {
			s.metrics.meteredSpills.WithLabelValues(in.spilledTo, surface).Inc()
		}
		if !in.routed && !in.unverified {
			// Refused before routing: counted, not recorded one by one. A
			// key the control plane could not check is recorded: it may
			// well be valid, and an outage's refusals must not go missing
			// (its worker's outbox bounds them).
			s.refusals.add(surface, in.keyID, refusalReason(in, r))
			return
		}
		if in.budgeted {
			s.ledger.add(in.requestID, in.keyID, in.team, in.session, requestSpend(s.settings.get().prices, rec))
			s.reporter.reportNow(rec)
			return
		}
		s.reporter.report(rec)
	}
}

// serve authenticates, reads the request, and runs the attempt loop. The
// order is the point: the key and its rate limit are checked before the
// body is read (a body takes memory, so only a key that may send now
// gets to), the model allowlist after (it needs the model).
func (s *Server) serve(w *trackingWriter, r *http.Request, in *inbound, rec *weirv1.RouteEvent) {
	defer in.letGo()
	refuse := func(reason string, apiErr *apiError) {
		if in.refusal == "" {
			in.refusal = reason
		}
		writeError(w, in.sf.wire, in.requestID, apiErr)
	}
	unread := r.ContentLength != 0 && r.ProtoMajor == 1
	if unread {
		// An answer before the body was read whole closes the connection:
		// net/http would otherwise read on through what is left of a body
		// under 256 KiB before answering, and a client that withholds it
		// would hold the answer. (HTTP/2 streams are answered as they are.)
		w.Header().Set("Connection", "close")
	}
	ctx := r.Context()
	secret := clientKey(r)
	if secret == "" {
		refuse(refusalMissingKey, errAuthentication("missing API key: send your weir key as x-api-key or Authorization: Bearer"))
		return
	}
	if apiErr := checkHeaders(r); apiErr != nil {
		refuse(refusalBadRequest, apiErr)
		return
	}
	in.keyHash = hashKey(secret)
	key, err := s.keys.verify(ctx, in.keyHash)
	if err != nil {
		if errors.Is(err, errKeyRejected) {
			refuse(refusalInvalidKey, errAuthentication("invalid API key"))
		} else {
			if ctx.Err() == nil {
				s.cfg.Logger.WarnContext(ctx, "verify key failed", "request_id", in.requestID, "err", err)
			}
			in.outcome = outcomeUnavailable
			// The key may well be valid: the request is recorded (with no
			// key) so that an outage's refusals are not missing. A client
			// that left meanwhile is only counted.
			in.unverified = ctx.Err() == nil
			apiErr := errControlPlane()
			rec.ErrorType, rec.FailureStage = apiErr.typ, weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT
			refuse(refusalUnverified, apiErr)
		}
		return
	}
	in.keyID, in.allowedModels = key.id, key.allowedModels
	in.budgeted, in.team = key.budgeted, key.team
	rec.KeyId = key.id
	if apiErr := s.admitKey(ctx, in, key); apiErr != nil {
		refuse(refusalKeyRateLimit, apiErr)
		return
	}
	if apiErr := s.readBody(w, r, in); apiErr != nil {
		refuse(refusalInvalidBody, apiErr)
		return
	}
	rec.Model, rec.Stream, rec.SessionKey, rec.Budgeted = in.model, in.stream, in.session, in.budgeted
	if apiErr := s.admitModel(in, key); apiErr != nil {
		refuse(refusalModelForbidden, apiErr)
		return
	}
	if pooledSurface(in.sf) {
		// Read (off this request's path) by the time its answer's
		// headers go out, if it was not known already.
		s.standings.want(in.keyHash, in.sf.api, in.model)
	}
	in.routed = true
	s.route(ctx, w, r, in, rec)
}

// refusalReason is why a request was refused before routing: the reason
// serve gave, unless the client had left first (a canceled check, an
// HTTP/2 stream reset).
func refusalReason(in *inbound, r *http.Request) string {
	if r.Context().Err() != nil && (in.refusal == refusalControlPlane || in.refusal == refusalUnverified || in.refusal == "") {
		return refusalCanceled
	}
	if in.refusal == "" {
		return refusalBadRequest
	}
	return in.refusal
}

// routing is one request's state across rounds and holds.
type routing struct {
	w   *trackingWriter
	r   *http.Request
	in  *inbound
	rec *weirv1.RouteEvent
	// holdEnd is when the hold budget (capped by the request's deadline)
	// runs out; holdEnd == start means fail fast. It is capacityEnd, or
	// sooner while the pool is unreachable (unreach, hold.go).
	holdEnd, capacityEnd time.Time
	unreachableHold      time.Duration
	unreach              unreachableState
	excluded             []string // accounts tried in this round
	prefer               string   // the account an overload retry returns to
	// overloads counts consecutive overload answers per account (nil
	// until the first: most requests never see one, and a stream keeps
	// its routing state for as long as it runs).
	overloads map[string]int32
	// last is the last upstream failure that was not an account's spent
	// quota, lastQuota the last that was: a pool out of quota is answered
	// with the latter, anything else with the former.
	last, lastQuota *bufferedResponse
	round           int // attempts in this round
	// roundTransport counts the round's transport errors; roundStart is
	// when it began.
	roundTransport int
	roundStart     time.Time
	// rounds counts the holds between rounds; it sets the backoff.
	rounds int
	// bursts counts consecutive same-account retries of rate-limit bursts
	// per account.
	bursts map[string]int32
	// changed is the pool's change signal as of the last Acquire: a hold
	// ends when it fires, whether before or during the wait.
	changed context.Context
	// omitted counts the records addRecord left out.
	omitted int
	// why is the one-line verdict a failure is answered with
	// (RouteEvent.verdict).
	why string
	// heldSince is when the request was first held; zero before.
	heldSince time.Time
}

// A route event carries at most maxRouteRecords attempt and hold records
// (the control plane refuses more). A request held through a long storm
// makes more: the first keepHeadRecords and the latest are kept, and one
// record between them says how many were left out. The event's counts
// (attempts, holds, held time) stay whole.
const (
	maxRouteRecords = 100
	keepHeadRecords = 50
)

// addRecord appends r to the route event's records within the bound.
func (rt *routing) addRecord(r *weirv1.AttemptRecord) {
	recs := rt.rec.AttemptRecords
	for len(recs) >= maxRouteRecords {
		// Drop the oldest record after the head (and the marker, once
		// there is one).
		at := keepHeadRecords
		if rt.omitted > 0 {
			at++
		}
		first := recs[at].GetAt()
		recs = slices.Delete(recs, at, at+1)
		rt.omitted++
		if rt.omitted == 1 {
			recs = slices.Insert(recs, keepHeadRecords, &weirv1.AttemptRecord{At: first})
		}
	}
	if rt.omitted > 0 {
		recs[keepHeadRecords].HoldReason = strconv.Itoa(rt.omitted) + " attempt and hold records left out"
	}
	rt.rec.AttemptRecords = append(recs, r)
}

// lastFailure is the upstream failure to answer with when weir gives up:
// when the pool is out of quota the last quota failure (else the last
// other), else only the last other one: an account's spent quota is not
// the pool's, and weir's own error says more truly why it gave up.
func (rt *routing) lastFailure(outOfQuota bool) *bufferedResponse {
	if outOfQuota && rt.lastQuota != nil {
		return rt.lastQuota
	}
	return rt.last
}

// quotaDecision says whether the control plane kept the account out on
// its quota: a quota cooldown (a spent window, out of credits) or a
// family's spent weekly window.
func quotaDecision(d *weirv1.Decision) bool {
	switch d.GetCooldown().GetReason() {
	case weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS:
		return true
	}
	return d.GetRung() == "family_gate"
}

// judge updates the request's verdict on its pool (hold.go) from its
// round so far and none, the control plane's answer that ended it, if
// any, and the hold budget with it.
func (rt *routing) judge(none *weirv1.NoAccount) {
	rt.unreach = rt.unreach.judge(rt.roundStart, rt.round, rt.roundTransport, none)
	rt.holdEnd = rt.unreach.holdEnd(rt.capacityEnd, rt.unreachableHold)
}

// unreachableCut says whether the unreachable hold ended the request's
// holds (hold.go).
func (rt *routing) unreachableCut() bool {
	return rt.unreach.cut(rt.capacityEnd, rt.unreachableHold)
}

// increment adds one to m[k], making m on first use.
func increment(m map[string]int32, k string) map[string]int32 {
	if m == nil {
		m = map[string]int32{}
	}
	m[k]++
	return m
}

// route runs routing rounds: each leases accounts until one answers or
// none is left; a round that ends on a transient failure is held and
// replayed with the same body until the hold budget runs out.
func (s *Server) route(ctx context.Context, w *trackingWriter, r *http.Request, in *inbound, rec *weirv1.RouteEvent) {
	st := s.settings.get()
	end := in.start.Add(min(st.capacityHold, st.requestDeadline))
	rt := &routing{w: w, r: r, in: in, rec: rec, holdEnd: end, capacityEnd: end, unreachableHold: st.unreachableHold, roundStart: in.start}
	// From here the request may be held or leased: it is recorded as in
	// progress until its final event (pending.go).
	s.pending.begin(rec)
	defer s.pending.end(in.requestID)
	for ctx.Err() == nil && !s.step(ctx, rt) { // until the client leaves or is answered
	}
}

// step is one turn of the routing loop: it leases an account and tries
// it, or holds, or answers. It reports whether the request is done.
func (s *Server) step(ctx context.Context, rt *routing) (done bool) {
	rt.changed = s.pool.changes()
	resp, err := s.lease(ctx, rt)
	switch {
	case err != nil:
		return s.acquireFailed(ctx, rt, err)
	case resp.GetLease() == nil:
		return s.noAccount(ctx, rt, resp.GetNoAccount())
	}
	return s.tryLease(ctx, rt, resp.GetLease())
}

// lease asks the pool for an account, and records the time the request
// waited for the answer as held.
func (s *Server) lease(ctx context.Context, rt *routing) (*weirv1.AcquireResponse, error) {
	in := rt.in
	asked := s.cfg.Now()
	req := &weirv1.AcquireRequest{
		KeyHash:           in.keyHash,
		Model:             in.model,
		SessionKey:        in.session,
		ExcludeAccountIds: rt.excluded,
		RequestId:         in.requestID,
		PreferAccountId:   rt.prefer,
		Surface:           in.sf.api,
		WaitingSince:      waitingSince(rt.heldSince),
	}
	if in.budgeted {
		req.Unreported = s.ledger.unreported(in.keyID, in.team, in.session)
	}
	resp, parked, err := s.pool.acquire(ctx, req, rt.rounds > 0, rt.holdEnd)
	if parked > 0 {
		// Parked with the other held requests of its class.
		s.recordHold(ctx, rt, s.cfg.Now().Add(-parked), parked, "waiting with this worker's held requests of the model for the pool to serve again")
	}
	if waited := s.cfg.Now().Sub(asked) - parked; waited >= slowAcquire {
		// A control plane that does not answer (hung, or its Postgres
		// slow) holds the request as surely as a refusal does.
		s.recordHold(ctx, rt, asked, waited, "waiting for the control plane to answer")
	}
	return resp, err
}

// waitingSince is a held request's place in the queue of waiters: when it
// was first held; nil before.
func waitingSince(heldSince time.Time) *timestamppb.Timestamp {
	if heldSince.IsZero() {
		return nil
	}
	return timestamppb.New(heldSince)
}

// acquireFailed acts on an Acquire that got no answer, or a refusal of
// the key.
func (s *Server) acquireFailed(ctx context.Context, rt *routing, err error) (done bool) {
	in := rt.in
	switch {
	case connect.CodeOf(err) == connect.CodePermissionDenied:
		s.keys.forget(in.keyHash)
		if model, ok := modelNotAllowedIn(err); ok {
			// The worker's cached allowlist was older than the key.
			in.outcome = outcomeModelForbidden
			rt.why = "the key may not use model " + model
			s.fail(rt.w, rt, nil, errModelNotAllowed(model))
			return true
		}
		rt.why = "the control plane refused the key"
		s.fail(rt.w, rt, nil, errAuthentication("invalid API key"))
		return true
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		if alias, ok := modelNotServedIn(err); ok {
			in.outcome = outcomeClientError
			rt.why = "alias " + alias + " resolves only to models this API does not serve"
			s.fail(rt.w, rt, nil, errModelNotServed(err))
			return true
		}
	case ctx.Err() != nil:
		return true
	}
	s.cfg.Logger.WarnContext(ctx, "acquire failed", "request_id", in.requestID, "err", err)
	// The control plane may be restarting: hold like any other transient
	// condition.
	if s.hold(ctx, rt, time.Time{}, true, "control plane unreachable") {
		return false
	}
	if rt.unreachableCut() {
		s.failUnreachable(rt.w, rt)
		return true
	}
	if rt.lastFailure(false) == nil {
		in.outcome = outcomeUnavailable
	}
	rt.why = "the control plane did not answer within the hold budget (" + heldText(rt) + ")"
	s.fail(rt.w, rt, rt.lastFailure(false), errControlPlane())
	return true
}

// noAccount acts on the control plane's answer that no account can serve
// now: it answers at once what no wait can help, else holds.
func (s *Server) noAccount(ctx context.Context, rt *routing, none *weirv1.NoAccount) (done bool) {
	in := rt.in
	in.poolQuota = none.GetQuotaBlock()
	now := s.cfg.Now()
	if b := none.GetBudget(); b != nil {
		rt.why = none.GetMessage()
		s.failBudget(rt.w, rt, b, none.GetMessage())
		return true
	}
	final := noAccountError(none, in.sf, in.model, now, maxTime(rt.holdEnd, now.Add(usageLimitMinWait)))
	if none.GetPermanent() || none.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED ||
		none.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED {
		rt.why = "no account can serve until an operator acts: " + none.GetMessage()
		s.failNoAccount(rt.w, rt, final)
		return true
	}
	if qb := none.GetQuotaBlock(); qb != nil && !recoversBy(qb, rt.holdEnd) {
		// Out of quota past the hold budget (or with no known reset at
		// all): no wait can help, so the client hears now.
		rt.why = quotaVerdict(qb, in.model)
		s.failOutOfQuota(rt.w, rt, none, final)
		return true
	}
	var retryAt time.Time
	if none.GetRetryAt() != nil {
		retryAt = none.GetRetryAt().AsTime()
	}
	// The shared breaker already paces every worker: wait for its next
	// probe, and no longer.
	backoff := none.GetReason() != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN
	rt.judge(none)
	reason := none.GetMessage()
	if rt.unreach.run != nil {
		reason = unreachableMessage(rt.unreach.run)
	}
	if s.hold(ctx, rt, retryAt, backoff, reason) {
		return false
	}
	if rt.unreachableCut() {
		s.failUnreachable(rt.w, rt)
		return true
	}
	switch {
	case !retryAt.IsZero() && retryAt.After(rt.holdEnd) && retryAt.Sub(s.cfg.Now()) > holdBackoffMax:
		// Not the end of a long wait: the soonest recovery is far off.
		rt.why = "no account can serve within the hold budget (the first back at " + retryAt.UTC().Format(time.RFC3339) + "): " + reason
	default:
		rt.why = "the hold budget ran out (" + heldText(rt) + ") with no account able to serve: " + reason
	}
	s.failOutOfQuota(rt.w, rt, none, final)
	return true
}

// tryLease makes one attempt on lease and acts on the control plane's
// decision: the answer went to the client, or the request fails over,
// retries the same account, or is answered with the last failure. Once a
// byte reached the client nothing is replayed: such an attempt's answer
// is the client's (res.failure is nil).
func (s *Server) tryLease(ctx context.Context, rt *routing, lease *weirv1.Lease) (done bool) {
	in, rec := rt.in, rt.rec
	o, d, res := s.tryOnce(ctx, rt, lease)
	if res.terminal != nil {
		s.finishTerminal(ctx, rt.w, in, res.terminal)
	}
	if res.failure == nil {
		// The answer, good or bad, went to the client.
		rec.ErrorType = o.ErrorType
		if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR {
			rec.FailureStage = weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT
		}
		return true
	}
	switch {
	case o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		// An upstream 401 names the account's credential; passed on, it
		// would tell the agent its own weir key is wrong.
	case quotaDecision(d):
		// One account's spent quota is not the pool's: a client told a
		// usage limit with a reset hours away stops, though another
		// account may serve after a storm.
		rt.lastQuota = res.failure
	default:
		rt.last = res.failure
	}
	rt.prefer = ""
	action := d.GetAction()
	if action == weirv1.Action_ACTION_RETRY_SAME && lease.Probe {
		// A breaker's probe that failed: the breaker paces the next probe,
		// on another account, and waiting a second to ask this one again
		// would only keep this request from taking it.
		action = weirv1.Action_ACTION_FAILOVER
	}
	switch action {
	case weirv1.Action_ACTION_RETRY_SAME:
		// Overload or a rate-limit burst: back to the same account after a
		// short wait, which counts against the hold budget like any other.
		why := "overloaded; retrying the same account"
		if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED {
			why = "rate-limit burst; retrying the same account"
		}
		if s.holdFor(ctx, rt, d.GetRetryAfter().AsDuration(), why) {
			rt.prefer = lease.AccountId
			return false
		}
		if ctx.Err() != nil {
			return true
		}
		rt.excluded = append(rt.excluded, lease.AccountId)
	case weirv1.Action_ACTION_FAILOVER:
		rt.excluded = append(rt.excluded, lease.AccountId)
	default:
		rec.ErrorType = o.ErrorType
		rt.why = fmt.Sprintf("the upstream's answer is the client's: %d %s (%s)", o.Status, o.ErrorType, shortClass(o.Class))
		failure := res.failure
		if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR {
			failure = rt.lastFailure(false) // never the account's 401 (above)
		}
		s.fail(rt.w, rt, failure, nil)
		return true
	}
	if rt.round < s.cfg.MaxAttempts {
		return false
	}
	// Enough for one round: wait before trying the pool again.
	if s.hold(ctx, rt, time.Time{}, true, "every attempt of the round failed") {
		return false
	}
	if rt.unreachableCut() {
		s.failUnreachable(rt.w, rt)
		return true
	}
	rt.why = fmt.Sprintf("the hold budget ran out (%s); the last attempt: %d %s (%s)", heldText(rt), o.Status, o.ErrorType, shortClass(o.Class))
	last := rt.lastFailure(false)
	if last == nil {
		last = rt.lastQuota // every attempt met a spent quota: it is all there is
	}
	s.fail(rt.w, rt, last, nil)
	return true
}

// tryOnce runs the attempt on lease, settles it with the control plane,
// and records it: in the route event, the request's routing state and
// the metrics. It returns the outcome, the control plane's decision and
// the attempt's result.
func (s *Server) tryOnce(ctx context.Context, rt *routing, lease *weirv1.Lease) (*weirv1.Outcome, *weirv1.Decision, attemptResult) {
	in, rec := rt.in, rt.rec
	rt.round++
	rec.Attempts++
	rec.AccountId = lease.AccountId
	in.spilledTo = ""
	if lease.SpilledToMetered {
		in.spilledTo = providerName(lease.Provider)
	}
	admitted := s.cfg.Now()
	at := admitted.Sub(in.start)
	if !rt.heldSince.IsZero() {
		s.pending.held(rec, time.Time{}, time.Time{}, "", admitted) // not held while it tries
	}
	actx, span := s.startAttemptSpan(ctx, lease, int(rec.Attempts))
	res := s.attempt(actx, rt.w, rt.r, in, lease, rt.overloads[lease.AccountId])
	o := res.outcome
	in.lastClass = o.Class
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR {
		rt.roundTransport++
	}
	rt.judge(nil) // an account that answered ends the unreachable hold
	o.PriorBursts = rt.bursts[lease.AccountId]
	// The model the attempt went upstream as: an alias's target, which the
	// body was rewritten to (upstream.go), else the client's.
	model := cmp.Or(lease.Model, in.model)
	var used *weirv1.TokenUsage
	if u := o.GetUsage(); u != nil {
		used = proto.CloneOf(u) // the route event's own: the outcome may still be on its way
		rec.Usage = addUsage(rec.Usage, used)
		rec.InputTokens, rec.OutputTokens = rec.Usage.InputTokens, rec.Usage.OutputTokens
		s.metrics.countTokens(providerName(lease.Provider), modelFamily(model), used)
	}
	s.metrics.attempts.WithLabelValues(providerName(lease.Provider), statusClass(int(o.Status)), shortClass(o.Class), causeName(o.TransportCause)).Inc()
	translation := translationFor(in.sf, lease.Provider).translationName()
	if translation != "" {
		s.metrics.translated.WithLabelValues(translation, shortClass(o.Class)).Inc()
	}
	d := s.release(actx, in, lease, o, admitted)
	endAttemptSpan(span, o, d)
	rt.addRecord(&weirv1.AttemptRecord{
		At: durationpb.New(at), AccountId: lease.AccountId, Class: o.Class, Status: o.Status,
		ErrorType: o.ErrorType, Action: d.GetAction(), Duration: o.Duration, Rung: d.GetRung(),
		SpilledToMetered: lease.SpilledToMetered,
		TransportCause:   o.TransportCause,
		Usage:            used,
		Model:            model,
		TransportError:   o.TransportError,
		Translation:      translation,
	})
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED {
		rt.overloads = increment(rt.overloads, lease.AccountId)
	} else {
		delete(rt.overloads, lease.AccountId)
	}
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED && d.GetAction() == weirv1.Action_ACTION_RETRY_SAME {
		rt.bursts = increment(rt.bursts, lease.AccountId)
	} else {
		delete(rt.bursts, lease.AccountId)
	}
	return o, d, res
}

// addUsage is sum plus u (a new sum when sum is nil): a request's usage
// over its attempts.
func addUsage(sum, u *weirv1.TokenUsage) *weirv1.TokenUsage {
	if sum == nil {
		sum = &weirv1.TokenUsage{}
	}
	sum.InputTokens += u.GetInputTokens()
	sum.OutputTokens += u.GetOutputTokens()
	sum.CacheReadTokens += u.GetCacheReadTokens()
	sum.CacheCreationTokens += u.GetCacheCreationTokens()
	sum.ReasoningTokens += u.GetReasoningTokens()
	return sum
}

// hold waits before the next routing round, or says that waiting cannot
// help (the budget is spent, or the soonest recovery comes after it).
func (s *Server) hold(ctx context.Context, rt *routing, retryAt time.Time, backoff bool, reason string) bool {
	now := s.cfg.Now()
	// Even a wait on a known time lasts a little: a clock running ahead of
	// the control plane's would otherwise see that time passed and spin.
	wait := holdBackoffBase
	if backoff {
		wait = holdBackoff(rt.rounds, s.cfg.Rand())
	}
	until, ok := holdUntil(now, rt.holdEnd, retryAt, wait)
	if !ok || !s.sleep(ctx, rt, until.Sub(now), rt.changed, reason) {
		return false
	}
	rt.excluded, rt.prefer, rt.round, rt.roundTransport, rt.roundStart = nil, "", 0, 0, s.cfg.Now()
	rt.rounds++
	return true
}

// holdFor waits exactly d (an overload retry), within the budget.
func (s *Server) holdFor(ctx context.Context, rt *routing, d time.Duration, reason string) bool {
	now := s.cfg.Now()
	if now.Add(d).After(rt.holdEnd) {
		return false
	}
	return s.sleep(ctx, rt, d, nil, reason)
}

// sleep waits d, or less when wake (if any) fires first: the pool changed
// and the next round may be served. It is false when the client left.
func (s *Server) sleep(ctx context.Context, rt *routing, d time.Duration, wake context.Context, reason string) bool {
	start := s.cfg.Now()
	if rt.heldSince.IsZero() {
		rt.heldSince = start
	}
	// Seen while it waits: weir routes, explain and status read it.
	s.pending.held(rt.rec, rt.heldSince, start.Add(d), reason, start)
	wctx := ctx
	if wake != nil {
		var cancel context.CancelFunc
		wctx, cancel = context.WithCancel(ctx)
		stop := context.AfterFunc(wake, cancel)
		defer func() {
			stop()
			cancel()
		}()
	}
	s.cfg.Sleep(wctx, d)
	s.recordHold(ctx, rt, start, s.cfg.Now().Sub(start), reason)
	return ctx.Err() == nil
}

// slowAcquire is how long an Acquire may take before the wait counts as
// held time: a healthy one takes milliseconds.
const slowAcquire = time.Second

// recordHold counts a wait that began at start and lasted held.
func (s *Server) recordHold(ctx context.Context, rt *routing, start time.Time, held time.Duration, reason string) {
	rt.addRecord(&weirv1.AttemptRecord{
		At: durationpb.New(start.Sub(rt.in.start)), HoldReason: reason, Duration: durationpb.New(held),
	})
	rt.rec.HoldCount++
	rt.rec.Held = durationpb.New(rt.rec.Held.AsDuration() + held)
	holdEvent(ctx, held)
	s.metrics.holds.Inc()
	s.metrics.holdSeconds.Observe(held.Seconds())
}

// failOutOfQuota answers a request that no account could serve when
// waiting cannot help: a final usage limit when the pool is out of quota
// in the usage_limit mode (the reset, not a retry loop), else as
// failNoAccount.
func (s *Server) failOutOfQuota(w http.ResponseWriter, rt *routing, none *weirv1.NoAccount, final *apiError) {
	if ul, ok := s.usageLimitFor(rt.in, none); ok {
		s.failUsageLimit(w, rt, ul)
		return
	}
	last := rt.lastFailure(none.GetQuotaBlock() != nil)
	if last == nil {
		rt.in.outcome = outcomeNoAccount
	}
	s.fail(w, rt, last, final)
}

// failUnreachable answers a request whose pool stayed unreachable for its
// unreachable hold: weir's 503 naming the cause, not the last attempt's
// 502.
func (s *Server) failUnreachable(w http.ResponseWriter, rt *routing) {
	rt.in.outcome = outcomeUpstreamUnreachable
	rt.why = unreachableMessage(rt.unreach.run)
	s.fail(w, rt, nil, errUnreachable(rt.unreach.run))
}

// failNoAccount answers a request that no account could serve: with
// the last upstream failure when there is one, else final.
func (s *Server) failNoAccount(w http.ResponseWriter, rt *routing, final *apiError) {
	last := rt.lastFailure(false)
	if last == nil {
		rt.in.outcome = outcomeNoAccount
	}
	s.fail(w, rt, last, final)
}

// fail answers a request that could not be served: the last upstream
// failure when there is one (it is the most truthful answer), else weir's
// own error.
func (s *Server) fail(w http.ResponseWriter, rt *routing, last *bufferedResponse, fallback *apiError) {
	rt.rec.FailureStage = weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT
	rt.rec.Verdict = rt.why
	if last != nil {
		rt.rec.ErrorType = errorTypeFor(last.body)
	} else if fallback != nil {
		rt.rec.ErrorType = fallback.typ
	}
	s.answer(w, rt.in, last, fallback)
}

func shortClass(c weirv1.OutcomeClass) string {
	return strings.TrimPrefix(strings.ToLower(c.String()), "outcome_class_")
}

// causeName is a transport cause's short name ("dns"), "none" when the
// attempt had none.
func causeName(c weirv1.TransportCause) string {
	if c == weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED {
		return "none"
	}
	return strings.TrimPrefix(strings.ToLower(c.String()), "transport_cause_")
}

// answer sends the last upstream failure when there is one (it is the
// most truthful answer), else fallback.
func (s *Server) answer(w http.ResponseWriter, in *inbound, last *bufferedResponse, fallback *apiError) {
	if last != nil {
		last.write(w)
		return
	}
	if fallback != nil {
		writeError(w, in.sf.wire, in.requestID, fallback)
	}
}

// readBody reads and checks the request body.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, in *inbound) *apiError {
	if r.Method == http.MethodGet {
		return nil
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		in.refusal = refusalBodyTooLarge
		return errTooLarge(s.cfg.MaxBodyBytes)
	}
	body, apiErr := s.bodyOf(w, r, in)
	if apiErr != nil {
		return apiErr
	}
	w.Header().Del("Connection") // read whole: the connection may serve on (serve)
	if !utf8.Valid(body) {
		// JSON is UTF-8; the upstream would refuse it after an account was
		// leased and a round trip spent (encoding/json would not: it turns
		// bad bytes into U+FFFD).
		return errInvalidRequest("request body is not valid UTF-8")
	}
	head, err := parseHead(body)
	if err != nil {
		var he headError
		if errors.As(err, &he) {
			return errInvalidRequest(he.Error())
		}
		return errInvalidRequest("request body is not valid JSON: " + jsonErrorText(err))
	}
	if head.model == nil || *head.model == "" {
		if in.sf.wire == wireOpenAI {
			return errInvalidRequest("Missing required parameter: 'model'.")
		}
		return errInvalidRequest("model: field required")
	}
	if !validModel(*head.model) {
		return errInvalidRequest("model: not a model name (control characters, or longer than " + strconv.Itoa(maxModelLen) + " bytes)")
	}
	in.body, in.model, in.stream = body, *head.model, head.stream
	in.session = sessionKey(r, in.sf, head.userID, head.promptCacheKey)
	return nil
}

// bodyOf reads the request's body, each byte reserved first in the body
// buffer (bodybudget.go), within the body timeouts; a Responses WebSocket
// message's body comes read and reserved already (websocket.go).
func (s *Server) bodyOf(w http.ResponseWriter, r *http.Request, in *inbound) ([]byte, *apiError) {
	if pre, ok := r.Context().Value(wsPrereadKey{}).(*wsPreread); ok {
		in.hold, in.history = pre.hold, pre.history
		return pre.body, nil
	}
	in.hold = &bodyHold{b: s.bodies, key: in.keyHash, lim: s.settings.get().body}
	// The body has deadlines of its own, lifted once it is read: the
	// response (a stream may run for many minutes) has none. Each read
	// must bring bytes within the idle timeout, and the whole body come
	// within the overall one.
	rc := http.NewResponseController(w)
	clock := s.newBodyClock()
	deadline := rc.SetReadDeadline(clock.next()) == nil
	var rd io.Reader = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if deadline {
		rd = &deadlineReader{r: rd, rc: rc, clock: clock}
	}
	body, err := readReserved(rd, r.ContentLength, s.cfg.MaxBodyBytes, in.hold)
	if deadline && err == nil {
		// After a failed read the deadline stays: net/http reads on to
		// drain what is left before it answers, and a stalled client
		// would hold that read (and its answer) forever.
		rc.SetReadDeadline(time.Time{}) //nolint:errcheck // set above, so supported
	}
	if err != nil {
		var tooLarge *http.MaxBytesError
		var netErr net.Error
		if apiErr := bodyBufferError(err); apiErr != nil {
			in.outcome, in.refusal = outcomeBodyBuffer, refusalBodyBuffer
			return nil, apiErr
		}
		switch {
		case errors.As(err, &tooLarge):
			in.refusal = refusalBodyTooLarge
			return nil, errTooLarge(s.cfg.MaxBodyBytes)
		case errors.As(err, &netErr) && netErr.Timeout():
			in.refusal = refusalBodyTimeout
			return nil, clock.err()
		}
		return nil, errInvalidRequest("could not read the request body")
	}
	return body, nil
}

// sessionKey is the conversation's affinity key: Claude Code's session id
// header, else metadata.user_id; Codex's session id header, else its
// prompt cache key. Long keys are hashed.
func sessionKey(r *http.Request, sf surface, userID, promptCacheKey string) string {
	var k string
	if sf.wire == wireOpenAI {
		for _, h := range []string{"Session_id", "Session-Id", "Conversation_id"} {
			if k = r.Header.Get(h); k != "" {
				break
			}
		}
		if k == "" {
			k = promptCacheKey
		}
	} else {
		k = r.Header.Get("X-Claude-Code-Session-Id")
		if k == "" {
			k = userID
		}
	}
	// Long keys, and keys with control characters (a NUL Postgres would
	// refuse to store), become their hash: still one key per session.
	if len(k) > 256 || hasControl(k) {
		k = hashKey(k)
	}
	return k
}

func jsonErrorText(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return syn.Error() + " at byte " + strconv.Itoa(int(syn.Offset))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of JSON input"
	}
	return "malformed"
}

// release reports the outcome and returns the control plane's decision. If
// the control plane cannot be reached, the worker acts on the outcome's
// default action (failpolicy), the table the control plane's decide
// starts from.
func (s *Server) release(ctx context.Context, in *inbound, lease *weirv1.Lease, o *weirv1.Outcome, admitted time.Time) *weirv1.Decision {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	d, err := s.pool.release(rctx, lease, o, admitted, in.session)
	if err == nil {
		return d
	}
	s.cfg.Logger.WarnContext(ctx, "release failed", "request_id", in.requestID, "err", err)
	return &weirv1.Decision{Action: failpolicy.For(o)}
}

func errControlPlane() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "api_error",
		message: "weir control plane unavailable; retry shortly", retryAfter: 2 * time.Second}
}

// noAccountError says why nothing could serve, and when that changes. A
// pool out of quota is answered as that (quotaError), retryable when its
// first reset comes by retryBy; anything else that passes on its own as
// overloaded.
func noAccountError(n *weirv1.NoAccount, sf surface, model string, now, retryBy time.Time) *apiError {
	if qb := n.GetQuotaBlock(); qb != nil && !n.GetPermanent() {
		return quotaError(qb, sf, model, now, retryBy)
	}
	e := &apiError{status: 529, typ: "overloaded_error", message: "weir: " + n.GetMessage()}
	if n.GetPermanent() || n.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED ||
		n.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED {
		// Only an operator can fix this: tell clients not to retry.
		e.status, e.typ, e.final = http.StatusServiceUnavailable, "api_error", true
		return e
	}
	if n.GetRetryAt() != nil {
		e.retryAfter = max(n.GetRetryAt().AsTime().Sub(now), time.Second)
	} else if n.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING {
		// Cooling with no known end: only rejected credentials remain.
		e.status, e.typ, e.final = http.StatusServiceUnavailable, "api_error", true
	}
	return e
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
