package dataplane

import (
	"encoding/json"
	"errors"
	"testing"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestFilterModelList(t *testing.T) {
	t.Parallel()
	page := `{"data":[{"type":"model","id":"claude-haiku-4-5","display_name":"Haiku"},` +
		`{"type":"model","id":"claude-sonnet-4-5","display_name":"Sonnet"},{"type":"model","id":"claude-sonnet-4"}],` +
		`"has_more":true,"first_id":"claude-haiku-4-5","last_id":"claude-sonnet-4"}`
	type list struct {
		Data []struct {
			ID          string `json:"id"`
			DisplayName string `json:"display_name"`
		} `json:"data"`
		HasMore bool    `json:"has_more"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
	}
	var got list
	if err := json.Unmarshal(filterModelList([]byte(page), []string{"claude-sonnet-*"}), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != 2 || got.Data[0].ID != "claude-sonnet-4-5" || got.Data[0].DisplayName != "Sonnet" ||
		got.Data[1].ID != "claude-sonnet-4" || !got.HasMore || *got.FirstID != "claude-sonnet-4-5" || *got.LastID != "claude-sonnet-4" {
		t.Fatalf("filtered: %+v", got)
	}
	got = list{}
	if err := json.Unmarshal(filterModelList([]byte(page), []string{"gpt-5*"}), &got); err != nil {
		t.Fatal(err)
	}
	if got.Data == nil || len(got.Data) != 0 || got.FirstID != nil || got.LastID != nil {
		t.Fatalf("nothing allowed: %+v", got)
	}
	for _, odd := range []string{`not json`, `{"data":"x"}`, `[]`} {
		if out := filterModelList([]byte(odd), []string{"x"}); string(out) != odd {
			t.Errorf("%s became %s", odd, out)
		}
	}
}

func TestModelNotAllowedIn(t *testing.T) {
	t.Parallel()
	denied := connect.NewError(connect.CodePermissionDenied, errors.New("model \"m\" is not allowed for this key"))
	d, err := connect.NewErrorDetail(&weirv1.ModelNotAllowed{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	denied.AddDetail(d)
	if m, ok := modelNotAllowedIn(denied); !ok || m != "m" {
		t.Errorf("with the detail: %q %v", m, ok)
	}
	// A rejected key is PERMISSION_DENIED without it.
	if _, ok := modelNotAllowedIn(connect.NewError(connect.CodePermissionDenied, errors.New("client key is unknown or revoked"))); ok {
		t.Error("a rejected key read as a refused model")
	}
	if _, ok := modelNotAllowedIn(errors.New("other")); ok {
		t.Error("a plain error read as a refused model")
	}
}
