package migrate_test

import "k8s.io/apimachinery/pkg/runtime/schema"

var svmGVR = schema.GroupVersionResource{Group: "storagemigration.k8s.io", Version: "v1", Resource: "storageversionmigrations"}
