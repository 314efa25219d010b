package controlplane

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// A batch's usage readings stored at once (folded, one statement) leave
// the same rows as storing each answer's readings one by one, in order
// (the store's own rule, UpsertUsageWindow): random batches over two
// windows whose resets jitter within 2 s or move on to a later window,
// some under a stale credential revision, against a random stored
// reading or none.
func TestFoldedUsageReadingsStoreAsOneByOne(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t)
	now := epoch
	rng := rand.New(rand.NewPCG(26, 5))
	newAccount := func() (uuid.UUID, int64) {
		a, _ := u.createAccount(acct{kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
		return uuid.MustParse(a.Id), a.CredentialRevision
	}
	stored := func(id uuid.UUID) string {
		got := u.getAccount(id.String())
		out := ""
		for _, name := range []string{windowFiveHour, windowSevenDay} {
			if w := window(got, name); w != nil {
				out += fmt.Sprintf("%s %v %v %s|", name, w.GetUtilization(), w.GetResetsAt().AsTime().Unix(), w.Source)
			}
		}
		return out
	}
	for trial := range 60 {
		seq, rev := newAccount()
		folded, frev := newAccount()
		// Each window's reset walks forward: the same window give or take
		// a second, or the next one.
		resets := map[string]time.Time{"5h": now.Add(2 * time.Hour), "7d": now.Add(50 * time.Hour)}
		if rng.IntN(2) == 0 {
			util, reset := float64(rng.IntN(100))/100, resets["5h"]
			for _, id := range []struct {
				id  uuid.UUID
				rev int64
			}{{seq, rev}, {folded, frev}} {
				if _, err := u.q.UpsertUsageWindow(t.Context(), db.UpsertUsageWindowParams{
					AccountID: id.id, WindowName: windowFiveHour, Utilization: &util, ResetsAt: &reset,
					Source: sourcePoll, Now: now.Add(-time.Minute), CredentialRevision: id.rev,
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		var batchSeq, batchFolded []answeredUsage
		for range 1 + rng.IntN(12) {
			h := map[string]string{}
			for _, w := range []string{"5h", "7d"} {
				if rng.IntN(4) == 0 {
					continue // this answer says nothing of w
				}
				if rng.IntN(6) == 0 {
					resets[w] = resets[w].Add(5 * time.Hour)
				}
				reset := resets[w].Add(time.Duration(rng.IntN(3)-1) * time.Second)
				h["anthropic-ratelimit-unified-"+w+"-status"] = "allowed"
				h["anthropic-ratelimit-unified-"+w+"-utilization"] = strconv.FormatFloat(float64(rng.IntN(100))/100, 'f', 2, 64)
				h["anthropic-ratelimit-unified-"+w+"-reset"] = strconv.FormatInt(reset.Unix(), 10)
			}
			stale := int64(0)
			if rng.IntN(8) == 0 {
				stale = 1
			}
			batchSeq = append(batchSeq, answeredUsage{account: seq, revision: rev - stale, headers: h})
			batchFolded = append(batchFolded, answeredUsage{account: folded, revision: frev - stale, headers: h})
		}
		for _, a := range batchSeq {
			for _, r := range readingsOf(upstream.HeaderReadings(a.headers, now)) {
				if _, err := u.q.UpsertUsageWindow(t.Context(), db.UpsertUsageWindowParams{
					AccountID: a.account, WindowName: r.window, Utilization: r.utilization, ResetsAt: r.resetsAt,
					Source: sourceHeader, Now: now, CredentialRevision: a.revision,
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := u.srv.acct.mergeUsageHeaders(t.Context(), u.q, batchFolded, now); err != nil {
			t.Fatal(err)
		}
		if a, b := stored(seq), stored(folded); a != b {
			t.Fatalf("trial %d: one by one %q, folded %q", trial, a, b)
		}
	}
}

// foldReadings keeps one reading per account, revision and window, sorted
// by account and window.
func TestFoldReadingsOnePerWindow(t *testing.T) {
	t.Parallel()
	now := epoch
	a, b := uuid.MustParse("00000000-0000-0000-0000-00000000000b"), uuid.MustParse("00000000-0000-0000-0000-00000000000a")
	reset := strconv.FormatInt(now.Add(time.Hour).Unix(), 10)
	h := func(util string) map[string]string {
		return map[string]string{"anthropic-ratelimit-unified-5h-status": "allowed",
			"anthropic-ratelimit-unified-5h-utilization": util, "anthropic-ratelimit-unified-5h-reset": reset}
	}
	got := foldReadings([]answeredUsage{
		{account: a, revision: 1, headers: h("0.2")}, {account: b, revision: 1, headers: h("0.5")},
		{account: a, revision: 1, headers: h("0.4")}, {account: a, revision: 1, headers: h("0.3")},
		{account: b, revision: 1, headers: nil},
	}, now)
	if len(got) != 2 || got[0].account != b || *got[0].utilization != 0.5 || got[1].account != a || *got[1].utilization != 0.4 {
		t.Fatalf("folded: %+v", got)
	}
}
