"""Running a scheduled step: batch metadata, the paged attention backend, the model call and sampling."""
