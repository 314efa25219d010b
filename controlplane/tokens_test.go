package controlplane

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pricing"
)

func (e *env) queryUsage(req *weirv1.QueryUsageRequest) *weirv1.QueryUsageResponse {
	e.t.Helper()
	resp, err := e.admin.usage.QueryUsage(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("QueryUsage: %v", err)
	}
	return resp.Msg
}

// usageTotals is the oracle's row: what a group's requests used.
type usageTotals struct {
	requests, input, output, cacheRead, cacheCreation, reasoning, nano int64
}

// TestUsageRollupAddsUp: random requests by three keys over three
// accounts and two models, some failing over (each attempt's tokens on
// its own account), some held first (a pending event, then the final
// one), every batch sent twice and some final events sent again later,
// sum in the rollup to exactly what a plain fold over the requests gives,
// whatever the grouping; the route events carry each request's total and
// cost.
func TestUsageRollupAddsUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := rand.New(rand.NewPCG(7, 23))
	var keys, accts []string
	for i := range 3 {
		k, _ := e.createKey(fmt.Sprintf("key-%d", i))
		keys = append(keys, k.Id)
		a, _ := e.createAccount(acct{label: fmt.Sprintf("acct-%d", i)})
		accts = append(accts, a.Id)
	}
	models := []string{"claude-sonnet-4-5-20250929", "claude-opus-4-1-20250805"}
	tab := pricing.NewTable(nil)
	type group struct{ key, account, model string }
	oracle := map[group]*usageTotals{}
	byKey := map[string]*usageTotals{}
	at := func(m map[group]*usageTotals, g group) *usageTotals {
		if m[g] == nil {
			m[g] = &usageTotals{}
		}
		return m[g]
	}
	var finals []*weirv1.RouteEvent
	var batch []*weirv1.RouteEvent
	flush := func() {
		if len(batch) == 0 {
			return
		}
		e.reportBatch(batch...)
		e.reportBatch(batch...) // the outbox sent it again: stored once
		batch = nil
	}
	for i := range 300 {
		key, model := keys[r.IntN(3)], models[r.IntN(2)]
		start := epoch.Add(time.Duration(r.IntN(48*3600)) * time.Second)
		ev := &weirv1.RouteEvent{RequestId: fmt.Sprintf("req-%03d", i), KeyId: key, Model: model, Surface: "messages",
			Status: 200, StartedAt: timestamppb.New(start), SessionKey: fmt.Sprintf("s-%d", r.IntN(10))}
		n := 1 + r.IntN(3)
		total := &weirv1.TokenUsage{}
		for j := range n {
			acct := accts[r.IntN(3)]
			rec := &weirv1.AttemptRecord{At: durationpb.New(time.Duration(j) * time.Second), AccountId: acct,
				Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Model: model}
			if j < n-1 {
				rec.Class, rec.Status = weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 529
			}
			if j == n-1 || r.IntN(3) == 0 { // a failed attempt sometimes reports what it consumed
				u := &weirv1.TokenUsage{InputTokens: r.Int64N(5000), OutputTokens: r.Int64N(3000),
					CacheReadTokens: r.Int64N(100000), CacheCreationTokens: r.Int64N(8000)}
				u.ReasoningTokens = u.OutputTokens / 3
				rec.Usage = u
				nano, _ := tab.Cost(model, priceUsage(u))
				o := at(oracle, group{key, acct, model})
				o.input += u.InputTokens
				o.output += u.OutputTokens
				o.cacheRead += u.CacheReadTokens
				o.cacheCreation += u.CacheCreationTokens
				o.reasoning += u.ReasoningTokens
				o.nano += nano
				total.InputTokens += u.InputTokens
				total.OutputTokens += u.OutputTokens
				total.CacheReadTokens += u.CacheReadTokens
				total.CacheCreationTokens += u.CacheCreationTokens
				total.ReasoningTokens += u.ReasoningTokens
			}
			ev.AttemptRecords = append(ev.AttemptRecords, rec)
			ev.AccountId = acct
		}
		ev.Attempts = int32(n)
		ev.Usage, ev.InputTokens, ev.OutputTokens = total, total.InputTokens, total.OutputTokens
		at(oracle, group{key, ev.AccountId, model}).requests++
		if byKey[key] == nil {
			byKey[key] = &usageTotals{}
		}
		if r.IntN(4) == 0 { // held first: its pending event comes in an earlier batch
			batch = append(batch, &weirv1.RouteEvent{RequestId: ev.RequestId, KeyId: key, Model: model, Surface: "messages",
				StartedAt: ev.StartedAt, Pending: true, SessionKey: ev.SessionKey})
			flush()
		}
		batch = append(batch, ev)
		finals = append(finals, ev)
		if len(batch) >= 1+r.IntN(40) {
			flush()
		}
	}
	flush()
	// A worker that restarted with its outbox on disk sends old finals again.
	e.reportBatch(finals[:50]...)

	since, until := timestamppb.New(epoch.Add(-time.Hour)), timestamppb.New(epoch.Add(72*time.Hour))
	got := e.queryUsage(&weirv1.QueryUsageRequest{GroupBy: []string{"key", "account", "model"}, Since: since, Until: until})
	if len(got.Rows) != len(oracle) {
		t.Errorf("%d rows, the oracle has %d groups", len(got.Rows), len(oracle))
	}
	var all usageTotals
	for _, row := range got.Rows {
		o := oracle[group{row.KeyId, row.AccountId, row.Model}]
		if o == nil {
			t.Errorf("row %v: no such group in the oracle", row)
			continue
		}
		want := usageTotals{o.requests, o.input, o.output, o.cacheRead, o.cacheCreation, o.reasoning, o.nano}
		have := usageTotals{row.Requests, row.InputTokens, row.OutputTokens, row.CacheReadTokens, row.CacheCreationTokens,
			row.ReasoningTokens, int64(row.CostUsd*1e9 + 0.5)}
		if want != have {
			t.Errorf("key %s account %s model %s:\n got %+v\nwant %+v", row.KeyName, row.AccountLabel, row.Model, have, want)
		}
		all.requests += row.Requests
		all.nano += o.nano
	}
	if all.requests != 300 {
		t.Errorf("%d requests counted, want 300", all.requests)
	}

	// One key, by day: the same sums, split at midnight.
	perDay := e.queryUsage(&weirv1.QueryUsageRequest{GroupBy: []string{"day"}, Key: "key-1", Since: since, Until: until})
	var want, have usageTotals
	for g, o := range oracle {
		if g.key == keys[1] {
			want.requests += o.requests
			want.input += o.input
		}
	}
	for _, row := range perDay.Rows {
		have.requests += row.Requests
		have.input += row.InputTokens
		if row.KeyId != "" || row.PeriodStart == nil || !row.PeriodStart.AsTime().Equal(row.PeriodStart.AsTime().Truncate(24*time.Hour)) {
			t.Errorf("a day row: %v", row)
		}
	}
	if want != have || len(perDay.Rows) < 2 {
		t.Errorf("key-1 by day: %d rows summing to %+v, want %+v over 2 or 3 days", len(perDay.Rows), have, want)
	}

	// The route event holds the request's total and its cost.
	ev := e.getEvent(finals[7].RequestId)
	if !proto.Equal(ev.Usage, finals[7].Usage) || ev.SessionKey != finals[7].SessionKey {
		t.Errorf("event usage %v session %q, want %v %q", ev.Usage, ev.SessionKey, finals[7].Usage, finals[7].SessionKey)
	}
	if ev.CostUsd <= 0 {
		t.Errorf("event cost %v", ev.CostUsd)
	}
}

// TestUsageQueryRefusals: what a usage query cannot mean is refused,
// naming the field.
func TestUsageQueryRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, req := range []*weirv1.QueryUsageRequest{
		{GroupBy: []string{"team"}},
		{GroupBy: []string{"day", "hour"}},
		{TimeZone: "Mars/Olympus"},
		{Since: timestamppb.New(epoch), Until: timestamppb.New(epoch.Add(-time.Hour))},
		{Key: "no-such-key"},
		{Limit: -1},
	} {
		_, err := e.admin.usage.QueryUsage(t.Context(), connect.NewRequest(req))
		if code := connect.CodeOf(err); code != connect.CodeInvalidArgument && code != connect.CodeNotFound {
			t.Errorf("%v: %v, want invalid argument or not found", req, err)
		}
	}
}

// TestPriceOverride: an operator's price applies to usage stored after it,
// and deleting it brings back the shipped one.
func TestPriceOverride(t *testing.T) {
	t.Parallel()
	e := setup(t)
	k, _ := e.createKey("")
	a, _ := e.createAccount(acct{})
	if _, err := e.admin.usage.SetPrice(t.Context(), connect.NewRequest(&weirv1.SetPriceRequest{
		Price: &weirv1.ModelPrice{Pattern: "gpt-6.2-sol", InputUsd: 2, OutputUsd: 10}})); err != nil {
		t.Fatal(err)
	}
	use := func(id string) {
		e.report(&weirv1.RouteEvent{RequestId: id, KeyId: k.Id, AccountId: a.Id, Model: "gpt-6.2-sol", Status: 200,
			Attempts: 1, StartedAt: timestamppb.New(epoch), AttemptRecords: []*weirv1.AttemptRecord{{AccountId: a.Id,
				Model: "gpt-6.2-sol", Usage: &weirv1.TokenUsage{InputTokens: 1_000_000, OutputTokens: 100_000}}}})
	}
	use("req-priced")
	if c := e.getEvent("req-priced").CostUsd; c != 3 {
		t.Errorf("cost %v, want $2 + $1", c)
	}
	if _, err := e.admin.usage.DeletePrice(t.Context(), connect.NewRequest(&weirv1.DeletePriceRequest{Pattern: "gpt-6.2-sol"})); err != nil {
		t.Fatal(err)
	}
	use("req-unpriced")
	resp := e.queryUsage(&weirv1.QueryUsageRequest{Since: timestamppb.New(epoch.Add(-time.Hour)), Until: timestamppb.New(epoch.Add(time.Hour))})
	if len(resp.Rows) != 1 || resp.Rows[0].CostUsd != 3 || resp.Rows[0].UnpricedTokens != 1_100_000 || !resp.HasUnpriced {
		t.Errorf("after the delete: %v", resp)
	}
	for _, bad := range []*weirv1.ModelPrice{{Pattern: ""}, {Pattern: "a*b"}, {Pattern: "m", InputUsd: -1}, {Pattern: "m", OutputUsd: 1e6}} {
		if _, err := e.admin.usage.SetPrice(t.Context(), connect.NewRequest(&weirv1.SetPriceRequest{Price: bad})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("SetPrice(%v) = %v, want invalid argument", bad, err)
		}
	}
}
