package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// ModelsPath is the models list under an account's base URL: Anthropic's
// /v1/models, and OpenAI's /models under a base that holds the version
// (docs/wire.md). Both providers serve it to any valid key, for free: the
// cheapest authenticated read an API key has.
func ModelsPath(anthropic bool) string {
	if anthropic {
		return "/v1/models"
	}
	return "/models"
}

// ReadModels GETs an API key's models list under base, authenticated the
// provider's way, and says only whether it answered 200: the list itself
// is not used. The error never holds the key.
func ReadModels(ctx context.Context, client *http.Client, base, key string, anthropic bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+ModelsPath(anthropic), nil)
	if err != nil {
		return fmt.Errorf("models request: %w", Scrub(err, key))
	}
	if anthropic {
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
	} else {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("models endpoint unreachable: %w", Scrub(transportErr(err), key))
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxUsageBody)) //nolint:errcheck // drained for the connection's reuse only
	if resp.StatusCode != http.StatusOK {
		return &StatusError{Endpoint: "models endpoint", Code: resp.StatusCode}
	}
	return nil
}
