//go:build tools

// The package built: KEDA's operator (its main package is github.com/kedacore/keda/v2/cmd/operator).
package tools

import _ "github.com/kedacore/keda/v2/cmd/operator"
