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

// An alias to another provider's model is not sent on the client's wire
// to a provider that cannot serve it: on Messages an alias whose targets
// are all OpenAI models is a 400 naming them, with no upstream attempt;
// one with a Claude target among them serves that; on Responses an alias
// to a Claude model is a 400 in the OpenAI format.
func TestAliasToAnotherWireRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "claude"}, {label: "cx", provider: "codex"}}})
	ctx := t.Context()
	for alias, targets := range map[string][]string{
		"team-coder": {"gpt-5.4"},
		"either":     {"gpt-5.4", model},
		"to-claude":  {model},
	} {
		if _, err := e.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: alias, Targets: targets})); err != nil {
			t.Fatal(err)
		}
	}
	body := func(alias string) string {
		return strings.Replace(messagesBody(false), `"model":"`+model+`"`, `"model":"`+alias+`"`, 1)
	}
	r := e.do(http.MethodPost, "/v1/messages", body("team-coder"), nil)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"type":"invalid_request_error"`) ||
		!strings.Contains(string(r.body), "gpt-5.4") || !strings.Contains(string(r.body), "Messages API does not serve") {
		t.Errorf("an alias to an OpenAI model on Messages: %d %s", r.status, r.body)
	}
	if atts := e.sim.Attempts(); len(atts) != 0 {
		t.Errorf("the refused alias reached the upstream: %+v", atts)
	}
	r = e.do(http.MethodPost, "/v1/messages", body("either"), nil)
	if atts := e.sim.Attempts(); r.status != http.StatusOK || len(atts) != 1 || atts[0].Model != model || atts[0].Account != "claude" {
		t.Errorf("an alias with a Claude target on Messages: %d %s, attempts %+v", r.status, r.body, atts)
	}
	resp := strings.Replace(responsesBody(false), `"model":"`+codexModel+`"`, `"model":"to-claude"`, 1)
	r = e.do(http.MethodPost, "/v1/responses", resp, bearer(e.key))
	typ, code, msg := openAIError(t, r, http.StatusBadRequest)
	if typ != "invalid_request_error" || code != "model_not_served" || !strings.Contains(msg, "Responses API does not serve") {
		t.Errorf("an alias to a Claude model on Responses: %s %s %s", typ, code, msg)
	}
	if atts := e.sim.Attempts(); len(atts) != 1 {
		t.Errorf("the refused Responses alias reached the upstream: %+v", atts)
	}
}
