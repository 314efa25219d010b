package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// A request naming a model alias reaches the upstream with the concrete
// model in its body, and nothing else of the body changed; a concrete
// model goes upstream as sent.
func TestModelAliasRewritesUpstreamModel(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "only"}}})
	if _, err := e.aliases.SetAlias(t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{
		Alias: "fast", Targets: []string{model},
	})); err != nil {
		t.Fatal(err)
	}
	sent := strings.Replace(messagesBody(false), `"model":"`+model+`"`, `"model":"fast"`, 1)
	r := e.do(http.MethodPost, "/v1/messages", sent, nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	atts := e.sim.Attempts()
	if len(atts) != 1 || atts[0].Model != model || atts[0].Outcome != "ok" {
		t.Fatalf("simulator attempts %+v, want one ok on %s", atts, model)
	}
	// The body upstream is the client's with only the model changed.
	if want := sha(messagesBody(false)); atts[0].BodySHA256 != want {
		t.Errorf("upstream body hash %s, want that of the body with %s", atts[0].BodySHA256, model)
	}
	e.leasesReleased()

	// A concrete model is never rewritten.
	r = e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if atts := e.sim.Attempts(); len(atts) != 2 || atts[1].Model != model || atts[1].BodySHA256 != sha(messagesBody(false)) {
		t.Fatalf("concrete request went upstream as %+v", atts)
	}
	e.leasesReleased()
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
