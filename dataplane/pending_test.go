package dataplane

import (
	"slices"
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestPendingRequests: a batch takes the requests registered and still in
// progress, oldest first, at most n, each once; the keeper renews those
// reported and not yet ended.
func TestPendingRequests(t *testing.T) {
	t.Parallel()
	p := newPendingRequests()
	for _, id := range []string{"a", "b", "c", "d"} {
		p.begin(&weirv1.RouteEvent{RequestId: id, Model: "m", SessionKey: "session-" + id})
	}
	p.end("b") // over before any batch: its final event stands alone
	ids := func(evs []*weirv1.RouteEvent) []string {
		var out []string
		for _, e := range evs {
			if !e.Pending || e.Model != "m" || e.SessionKey != "session-"+e.RequestId {
				t.Errorf("pending event %v", e)
			}
			out = append(out, e.RequestId)
		}
		return out
	}
	if got := ids(p.due(2)); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("first batch %v, want [a c]", got)
	}
	if got := ids(p.due(10)); !slices.Equal(got, []string{"d"}) {
		t.Errorf("second batch %v, want [d]", got)
	}
	if got := p.due(10); len(got) != 0 {
		t.Errorf("third batch %v, want none", got)
	}
	p.end("c")
	got := p.reported()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "d"}) {
		t.Errorf("renewed %v, want [a d]", got)
	}
}
