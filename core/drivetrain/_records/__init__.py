"""Run records: loggers, the recorder callback that feeds them, and the history a Trainer keeps."""
