//go:build tools

// The packages built: KEDA's operator and its metrics adapter (their main packages are
// github.com/kedacore/keda/v2/cmd/operator and .../cmd/adapter).
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
